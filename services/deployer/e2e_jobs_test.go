package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
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
	for _, tool := range []string{"ansible-playbook", "git", "sshd"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				t.Fatalf("%s is missing (make test installs it)", tool)
			}
		}
	}
	root, err := target.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	token := "ghs_" + testenv.Unique("")

	// The playbook repository.
	repos := t.TempDir()
	work := filepath.Join(t.TempDir(), "work")
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + repos, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t",
			"GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "--initial-branch=main", work)
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
	if err := os.WriteFile(filepath.Join(work, "site.yml"), []byte(site), 0o644); err != nil {
		t.Fatal(err)
	}
	git("-C", work, "add", "-A")
	git("-C", work, "commit", "-q", "-m", "site")
	git("-C", work, "tag", "v1")
	git("clone", "-q", "--bare", work, filepath.Join(repos, "org", "ops.git"))
	gitURL, refused := serveRepos(t, "127.0.0.1", token, repos)

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

	dsn, redisURL := testenv.Postgres(t), testenv.RedisDB(t)
	bins := t.TempDir()
	const ap = "github.com/autoprovisioner/autoprovisioner/"
	for _, b := range []struct {
		out, pkg string
		static   bool
	}{
		{"infra", ap + "services/infra", false},
		{"runguard", ap + "pkg/ansible/cmd/runguard", true},
		{"deployer", ".", false},
	} {
		if err := testenv.GoBuild(filepath.Join(bins, b.out), b.pkg, b.static); err != nil {
			t.Fatalf("build %s: %v", b.pkg, err)
		}
	}
	secretDir := t.TempDir()
	const requestKey = "deployer-request-key-0123456789abcdef-0123456789"
	if err := os.WriteFile(filepath.Join(secretDir, "deployer-request-key"), []byte(requestKey), 0o600); err != nil {
		t.Fatal(err)
	}
	runRoot := "/tmp/dj-" + testenv.Unique("")[:8] // short: ssh's socket names sit under it
	t.Cleanup(func() { os.RemoveAll(runRoot) })
	out := t.TempDir()
	common := []string{"DATABASE_URL=" + dsn, "REDIS_URL=" + redisURL, "LOG_FORMAT=json", "DEPLOY_SECRET_REFS=env:PROJ_SECRET_*"}
	infraAdmin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	infraEnv := testenv.BinaryEnv(append(common,
		"ADMIN_ADDR="+infraAdmin, "PLAYBOOK_DIR="+filepath.Join(root, "ansible"), "PLAYBOOK_RUN_ROOT="+runRoot,
		"SECRETS_FILE_ROOT="+secretDir, "SSH_KEY_REF=env:AUTOPROV_SECRET_SSH_KEY", "AUTOPROV_SECRET_SSH_KEY="+string(sshd.ClientKey),
		"SSH_BASE_DELAY=200ms", "SSH_ATTEMPT_TIMEOUT=3s",
		"SPECIAL_ALLOW_NETWORKS=127.0.0.0/8", "DEPLOY_ALLOW_NETWORKS=127.0.0.0/8",
		"SOURCES_ALLOW_HTTP=true", "JOB_WORK_DIR="+filepath.Join(t.TempDir(), "jobs"),
		"SOURCES_CACHE_DIR="+filepath.Join(t.TempDir(), "sources"),
		"PROJECT_SECRETS_ENV_PREFIX=PROJ_SECRET_", "PROJ_SECRET_GIT="+token,
		// The target is not a registered server: the job brings its own
		// SSH key (infra's key is never lent to a job).
		"PROJ_SECRET_SSH="+string(sshd.ClientKey),
		"REQUEST_SIGNATURES=require", "REQUEST_KEYS=deployer-1@ansible:job:queue=file:deployer-request-key")...)
	infra := testenv.StartBinary(t, filepath.Join(bins, "infra"), infraEnv)
	infra.WaitHTTP("http://"+infraAdmin+"/readyz", 200, time.Minute)
	api, admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	const hookKey = "e2e-webhook-signing-key-0123456789abcdef"
	depEnv := append(common, "WEBHOOK_SIGNING_KEY="+hookKey)
	deployer := testenv.StartBinary(t, filepath.Join(bins, "deployer"), testenv.BinaryEnv(append(depEnv, "API_ADDR="+api, "ADMIN_ADDR="+admin,
		"REQUEST_SIGNING_KEY_ID=deployer-1", "REQUEST_SIGNING_KEY="+requestKey, "WEBHOOK_ALLOW_CIDRS=127.0.0.1/32")...))
	deployer.WaitHTTP("http://"+admin+"/readyz", 200, 2*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("infra logs:\n%s\ndeployer logs:\n%s", infra.Stderr(), deployer.Stderr())
		}
	})

	const project = "3c9a7e10-5b2d-4f6e-8a1c-9d0e2f4b6a81"
	stdout, stderr, code := testenv.RunBinary(t, filepath.Join(bins, "deployer"), testenv.BinaryEnv(depEnv...),
		"keys", "create", "--name", "ci", "--scopes", "jobs:write,credentials:write", "--project", project, "--json")
	var created struct {
		Key           string `json:"key"`
		WebhookSecret string `json:"webhook_secret"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &created) != nil || created.WebhookSecret == "" {
		t.Fatalf("keys create: %d %s %s", code, stdout, stderr)
	}
	call := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+api+"/api/v1"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+created.Key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []string{`{"name":"git","ref":"env:PROJ_SECRET_GIT"}`, `{"name":"ssh","ref":"env:PROJ_SECRET_SSH"}`} {
		if code, resp := call("POST", "/credentials", c); code != 201 {
			t.Fatalf("credential: %d %s", code, resp)
		}
	}
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
	events := followEvents(t, "http://"+api+"/api/v1/jobs/"+j.ID+"/stream", created.Key)
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
	if hook.Header.Get(webhooks.HeaderEvent) != webhooks.EventJobFinished || !strings.Contains(string(body), `"status":"succeeded"`) {
		t.Errorf("webhook %s: %s", hook.Header.Get(webhooks.HeaderEvent), body)
	}
	if err := webhooks.Verify(created.WebhookSecret, hook.Header.Get(webhooks.HeaderSignature), body, time.Hour, time.Now()); err != nil {
		t.Errorf("webhook signature: %v", err)
	}
	if refused() != 0 {
		t.Errorf("the git server refused %d requests", refused())
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
	infra2 := testenv.StartBinary(t, filepath.Join(bins, "infra"), infraEnv)
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
