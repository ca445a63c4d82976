package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// TestJobEndToEndWithRealInfra runs an Ansible job (issue 23) through the
// deployer's API with a project key: a playbook from a git repository
// served over HTTP with a token (named by a stored credential, which the
// deployer resolves to its reference), run by the real infra binary with
// real ansible-playbook on a loopback sshd target. The test follows the
// job's events (SSE), waits for its end, reads its log, receives its signed
// job.finished webhook, and checks the play's effect on the target and
// that the token is in no answer or log. A job cancelled while infra is
// down is never run: infra publishes the result the deployer stored.
func TestJobEndToEndWithRealInfra(t *testing.T) {
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	token := "ghs_" + testenv.Unique("")

	// The playbook repository.
	repos := t.TempDir()
	const site = `- name: Greet
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the greeting
      ansible.builtin.copy:
        content: "{{ greeting }}"
        dest: "{{ out }}/{{ inventory_hostname }}.txt"
        mode: "0644"
`
	jobRepo(t, repos, site)
	gitURL, git := serveRepos(t, "127.0.0.1", token, repos)

	// The webhook receiver.
	var mu sync.Mutex
	var hooks []*http.Request
	var hookBodies [][]byte
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hooks, hookBodies = append(hooks, r), append(hookBodies, b)
		mu.Unlock()
	}))
	t.Cleanup(recv.Close)

	stack := startJobStack(t, token, sshd.ClientKey)
	infra := stack.startInfra(t)
	deployer := stack.deployer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("infra logs:\n%s\ndeployer logs:\n%s", infra.Stderr(), deployer.Stderr())
		}
	})
	out := t.TempDir()
	call := func(method, path, body string) (int, string) { return stack.call(t, method, path, body) }
	job := fmt.Sprintf(`{"source":{"type":"playbook","repository":%q,"ref":"v1","paths":["site.yml"],"git_credential":"git"},
		"inventory":{"type":"inline","hosts":{"t1":{"ansible_host":%q,"ansible_port":%d,"ansible_user":%q}}},
		"credentials":{"ssh":"ssh"},
		"options":{"extra_vars":{"out":%q,"greeting":"hello from a job"},"timeout":600,"callback_url":%q}}`,
		gitURL+"/org/ops.git", sshd.Host, sshd.Port, sshd.User, out, recv.URL+"/hooks/job")
	code, resp := call("POST", "/jobs", job)
	if code != 202 {
		t.Fatalf("submit: %d %s", code, resp)
	}
	var j struct {
		ID       string `json:"id"`
		Status   string `json:"status"`
		Progress struct {
			HostsChanged int  `json:"hosts_changed"`
			HostsPending *int `json:"hosts_pending"`
		} `json:"progress"`
		Result *struct {
			Commit    string `json:"commit"`
			Playbooks []struct{ Playbook, Status string }
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(resp), &j); err != nil {
		t.Fatal(err)
	}
	events := followEvents(t, "http://"+stack.api+"/api/v1/jobs/"+j.ID+"/stream", stack.key)
	code, resp = call("GET", "/jobs/"+j.ID+"?wait=5m", "")
	if err := json.Unmarshal([]byte(resp), &j); err != nil || code != 200 || j.Status != "succeeded" {
		t.Fatalf("job: %d %s", code, resp)
	}
	if j.Result == nil || j.Result.Commit == "" || len(j.Result.Playbooks) != 1 || j.Progress.HostsChanged != 1 {
		t.Errorf("job result: %s", resp)
	}
	if got, err := os.ReadFile(filepath.Join(out, "t1.txt")); err != nil || string(got) != "hello from a job" {
		t.Errorf("the play's file on the target: %q %v", got, err)
	}
	sse := <-events
	if len(sse.types) < 4 || sse.types[0] != "run_started" || sse.types[len(sse.types)-1] != "run_finished" {
		t.Errorf("events: %v", sse.types)
	}
	code, log := call("GET", "/jobs/"+j.ID+"/logs", "")
	if code != 200 || !strings.Contains(log, "Write the greeting") {
		t.Errorf("log: %d %s", code, log)
	}
	testenv.WaitFor(t, time.Minute, "the job.finished webhook", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(hooks) > 0
	})
	mu.Lock()
	hook, body := hooks[0], hookBodies[0]
	mu.Unlock()
	if hook.Header.Get(hmacsig.HeaderEvent) != webhooks.EventJobFinished || !strings.Contains(string(body), `"status":"succeeded"`) {
		t.Errorf("webhook %s: %s", hook.Header.Get(hmacsig.HeaderEvent), body)
	}
	if err := hmacsig.Verify(stack.hookKey, hook.Header.Get(hmacsig.HeaderSignature), body, time.Hour, time.Now()); err != nil {
		t.Errorf("webhook signature: %v", err)
	}
	if n := git.refused.Load(); n != 0 {
		t.Errorf("the git server refused %d requests", n)
	}

	// Cancel while queued: with infra stopped, the job is cancelled at
	// once (its run recorded done, with an AnsibleJobResult); infra,
	// started again, publishes that result and never runs the job.
	infra.Signal(syscall.SIGTERM)
	if c := infra.Wait(time.Minute); c != 0 {
		t.Errorf("infra exit %d", c)
	}
	if err := os.Remove(filepath.Join(out, "t1.txt")); err != nil {
		t.Fatal(err)
	}
	code, queued := call("POST", "/jobs", job)
	var q struct{ ID, Status string }
	if err := json.Unmarshal([]byte(queued), &q); err != nil || code != 202 {
		t.Fatalf("submit: %d %s", code, queued)
	}
	if code, r := call("DELETE", "/jobs/"+q.ID, ""); code != 200 || !strings.Contains(r, `"status":"cancelled"`) {
		t.Fatalf("cancel queued job: %d %s", code, r)
	}
	infra2 := stack.startInfra(t)
	testenv.WaitFor(t, 2*time.Minute, "infra to publish the stored cancelled result", func() bool {
		for _, line := range strings.Split(infra2.Stderr(), "\n") {
			if strings.Contains(line, q.ID) && strings.Contains(line, "publishing its stored result again") {
				return true
			}
		}
		return false
	})
	if code, r := call("GET", "/jobs/"+q.ID, ""); code != 200 || !strings.Contains(r, `"status":"cancelled"`) {
		t.Errorf("the cancelled job: %d %s", code, r)
	}
	if _, err := os.Stat(filepath.Join(out, "t1.txt")); err == nil {
		t.Error("the cancelled job ran")
	}

	for where, text := range map[string]string{"the job": resp, "its log": log, "its events": sse.text, "the webhook": string(body),
		"the deployer's log": deployer.Stderr(), "infra's log": infra.Stderr() + infra2.Stderr()} {
		if strings.Contains(text, token) {
			t.Errorf("the git token is in %s", where)
		}
	}
}
