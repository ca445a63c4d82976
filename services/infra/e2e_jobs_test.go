package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// The Ansible job tests (issue 23) run the real infra binary on real
// loopback sshd targets, with playbooks from a real git repository served
// over HTTP with a token, and real ansible-playbook.

const jobProject = "5d7e2a1c-3b4f-4e6a-9c8d-1f2e3a4b5c6d"

// jobWorld is one test's infra, targets and repository.
type jobWorld struct {
	*e2e
	sshds []*testenv.SSHD
	repo  *sourcestest.WorkRepo
	git   *sourcestest.GitServer
	out   string // where the test plays write (the targets are this machine)
	env   []string
}

// newJobWorld starts n sshd targets that all accept the first one's client
// key (the service's default key) and a git server with one repository.
func newJobWorld(t *testing.T, n int) *jobWorld {
	t.Helper()
	w := &jobWorld{}
	for range n {
		w.sshds = append(w.sshds, testenv.StartSSHD(t, testenv.SSHDOptions{}))
	}
	for _, s := range w.sshds[1:] {
		f, err := os.OpenFile(filepath.Join(s.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, w.sshds[0].ClientPublicKey)
		f.Close()
	}
	w.e2e = newE2E(t, w.sshds[0])
	w.git = sourcestest.NewGitServer(t, "job-token")
	w.repo = w.git.NewRepo(t, "ops.git")
	w.out = t.TempDir()
	w.env = []string{
		"SOURCES_ALLOW_HTTP=true",
		// Next to the run root: traversable by the sandbox's job users.
		"JOB_WORK_DIR=" + filepath.Join(filepath.Dir(w.e2e.runRoot), "jobs"),
		"SOURCES_CACHE_DIR=" + filepath.Join(t.TempDir(), "sources"),
		"DEPLOY_ALLOW_NETWORKS=127.0.0.0/8",
		"PROJECT_SECRETS_ENV_PREFIX=PROJ_SECRET_",
		"DEPLOY_SECRET_REFS=env:PROJ_SECRET_*",
		"PROJ_SECRET_GIT=job-token",
		"PROJ_SECRET_SSH=" + string(w.sshds[0].ClientKey),
	}
	return w
}

// start starts an infra process with the world's settings and extra.
func (w *jobWorld) start(extra ...string) *infraProc {
	return w.infra(append(append([]string{}, w.env...), extra...)...)
}

// host is an inline inventory host on sshd i.
func (w *jobWorld) host(i int) messages.Vars {
	s := w.sshds[i]
	return messages.Vars{"ansible_host": s.Host, "ansible_port": int64(s.Port), "ansible_user": s.User}
}

// deadHost is an inline inventory host on a loopback port nothing listens on.
func (w *jobWorld) deadHost(t *testing.T) messages.Vars {
	return messages.Vars{"ansible_host": "127.0.0.1", "ansible_port": int64(testenv.FreePort(t))}
}

// job returns a playbook job of the world's repository.
func (w *jobWorld) job(id string, hosts map[string]messages.Vars, paths ...string) *messages.AnsibleJobMessage {
	return &messages.AnsibleJobMessage{
		RequestMeta: messages.RequestMeta{JobID: id},
		ProjectID:   jobProject,
		Source: messages.JobSource{Type: messages.SourcePlaybook, Repository: w.repo.URL, Paths: paths,
			GitCredential: "env:PROJ_SECRET_GIT"},
		Inventory:   messages.JobInventory{Type: messages.InventoryInline, Hosts: hosts},
		Credentials: messages.JobCredentials{SSH: "env:PROJ_SECRET_SSH"},
		Options:     messages.JobOptions{ExtraVars: messages.Vars{"out": w.out}},
	}
}

// submit publishes m on its pool's stream.
func (w *jobWorld) submit(m *messages.AnsibleJobMessage) {
	w.publish(messages.AnsibleJobQueue(m.Options.Pool), m)
}

// jobResults returns the results of jobID.
func (e *e2e) jobResults(jobID string) []*messages.AnsibleJobResult {
	var out []*messages.AnsibleJobResult
	for _, m := range e.results(messages.StreamJobResults) {
		r, err := messages.DecodeAnsibleJobResult([]byte(m.Values["data"].(string)))
		if err != nil {
			e.t.Fatalf("undecodable result %s: %v", m.ID, err)
		}
		if r.JobID == jobID {
			out = append(out, r)
		}
	}
	return out
}

// waitJob waits for the result of jobID.
func (e *e2e) waitJob(jobID string, timeout time.Duration) *messages.AnsibleJobResult {
	e.t.Helper()
	var got *messages.AnsibleJobResult
	testenv.WaitFor(e.t, timeout, "the result of job "+jobID, func() bool {
		if rs := e.jobResults(jobID); len(rs) > 0 {
			got = rs[0]
			return true
		}
		return false
	})
	return got
}

// jobStatus checks a job result's status and error kind.
func jobStatus(t *testing.T, r *messages.AnsibleJobResult, status messages.Status, kind messages.ErrorKind) {
	t.Helper()
	var gotKind messages.ErrorKind
	msg := ""
	if r.Error != nil {
		gotKind, msg = r.Error.Kind, r.Error.Message
	}
	if r.Status != status || gotKind != kind {
		t.Fatalf("job %s: %s/%s (%s), want %s/%s\noutput:\n%s", r.JobID, r.Status, gotKind, msg, status, kind, r.OutputTail)
	}
}

// The plays of the test repository. site.yml writes a marker per host and
// tag; slow.yml records its start and end and sleeps in between.
const (
	sitePlay = `- name: Site
  hosts: all
  gather_facts: false
  tasks:
    - name: Tag a
      ansible.builtin.copy:
        content: "a"
        dest: "{{ out }}/{{ inventory_hostname }}.a"
        mode: "0644"
      tags: [a]
    - name: Tag b
      ansible.builtin.copy:
        content: "b"
        dest: "{{ out }}/{{ inventory_hostname }}.b"
        mode: "0644"
      tags: [b]
`
	slowPlay = `- name: Slow
  hosts: all
  gather_facts: false
  tasks:
    - name: Hold the host
      ansible.builtin.shell: >-
        echo "start job {{ inventory_hostname }} $(date +%s.%N)" >> {{ out }}/spans.log;
        sleep {{ hold | default(2) }};
        echo "end job {{ inventory_hostname }} $(date +%s.%N)" >> {{ out }}/spans.log
      changed_when: true
`
)

// TestAnsibleJobInlineInventory: three inline hosts, one of them down: the
// two others run, the recap shows the third unreachable, the result names
// the commit of the tag; tags, limit, check and diff are honoured.
func TestAnsibleJobInlineInventory(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 2)
	commit := w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	w.repo.Tag(t, "v1")
	w.repo.Commit(t, map[string]string{"site.yml": "not: a play at main\n"})
	w.start()

	hosts := map[string]messages.Vars{"t1": w.host(0), "t2": w.host(1), "t3": w.deadHost(t)}
	m := w.job("job-inline", hosts, "site.yml")
	m.Source.Ref = "v1"
	m.Options.Tags = []string{"b"}
	w.submit(m)
	r := w.waitJob("job-inline", 3*time.Minute)
	jobStatus(t, r, messages.StatusFailed, messages.KindHostsUnreachable)
	if r.Commit != commit {
		t.Errorf("commit %q, want the tag's %s", r.Commit, commit)
	}
	for _, h := range []string{"t1", "t2"} {
		if got := r.Hosts[h]; got.Changed != 1 || got.Unreachable != 0 || got.Failed != 0 {
			t.Errorf("recap of %s: %+v, want one change (only tag b ran)", h, got)
		}
		if _, err := os.Stat(filepath.Join(w.out, h+".b")); err != nil {
			t.Errorf("%s: tag b did not run: %v", h, err)
		}
		if _, err := os.Stat(filepath.Join(w.out, h+".a")); err == nil {
			t.Errorf("%s: tag a ran although tags=[b]", h)
		}
	}
	if got := r.Hosts["t3"]; got.Unreachable == 0 {
		t.Errorf("recap of the down host: %+v, want unreachable", got)
	}
	if len(r.Playbooks) != 1 || r.Playbooks[0].Status != messages.PlaybookUnreachable || r.Playbooks[0].Playbook != "site.yml" {
		t.Errorf("playbooks %+v", r.Playbooks)
	}

	// limit t1 and check mode: nothing written, t2 and t3 not touched.
	m = w.job("job-check", hosts, "site.yml")
	m.Source.Ref = "v1"
	m.Options.Limit, m.Options.Check, m.Options.Diff, m.Options.Tags = "t1", true, true, []string{"a"}
	w.submit(m)
	r = w.waitJob("job-check", 3*time.Minute)
	jobStatus(t, r, messages.StatusSucceeded, "")
	if _, ok := r.Hosts["t2"]; ok || len(r.Hosts) != 1 || r.Hosts["t1"].Changed != 1 {
		t.Errorf("recap %+v, want t1 alone with one (checked) change", r.Hosts)
	}
	if _, err := os.Stat(filepath.Join(w.out, "t1.a")); err == nil {
		t.Error("check mode wrote the file")
	}
	if !strings.Contains(r.OutputTail, "+++ after") {
		t.Errorf("no diff in the output:\n%s", r.OutputTail)
	}
	if run := w.run("job-check"); run.Kind != "job" || run.Status != string(messages.StatusSucceeded) {
		t.Errorf("run row %+v", run)
	}
	// The progress stream of the job's kind.
	if n := w.rdb.XLen(context.Background(), messages.ProgressStream(messages.JobKindJob, "job-check")).Val(); n < 3 {
		t.Errorf("%d progress events, want the run's", n)
	}
}

// TestAnsibleJobRejectsBadInput: an invalid job, a job on another pool's
// stream and one that would need infra's own SSH key are rejected with field errors and dead-lettered; a repository
// with a symlink out of the checkout is rejected before anything runs.
func TestAnsibleJobRejectsBadInput(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	if err := os.Symlink("/etc/hostname", filepath.Join(w.repo.Dir, "escape.yml")); err != nil {
		t.Fatal(err)
	}
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	w.start()

	bad := w.job("job-bad", map[string]messages.Vars{"t1": w.host(0)}, "site.yml")
	bad.Options.ExtraVars = messages.Vars{"ansible_connection": "local"}
	w.submit(bad)
	r := w.waitJob("job-bad", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
	if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "options.extra_vars[ansible_connection]" {
		t.Errorf("fields %+v", r.Error.Fields)
	}
	other := w.job("job-other-pool", map[string]messages.Vars{"t1": w.host(0)}, "site.yml")
	other.Options.Pool = "gpu"
	w.publish(messages.StreamAnsibleJobQueue, other) // on the default pool's stream
	r = w.waitJob("job-other-pool", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)

	nokey := w.job("job-no-key", map[string]messages.Vars{"t1": w.host(0)}, "site.yml")
	nokey.Credentials.SSH = "" // infra's own key is never lent to a job
	w.submit(nokey)
	r = w.waitJob("job-no-key", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
	if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "inventory.hosts[t1]" {
		t.Errorf("fields %+v", r.Error.Fields)
	}

	// A number that is no dotted-decimal address: ssh would read it as
	// 127.0.0.2; refused as the requester's error before any lookup.
	numeric := w.host(0)
	numeric["ansible_host"] = "0x7f000002"
	num := w.job("job-numeric", map[string]messages.Vars{"n1": numeric}, "site.yml")
	w.submit(num)
	r = w.waitJob("job-numeric", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
	if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "inventory.hosts[n1]" || !strings.Contains(r.Error.Fields[0].Message, "dotted-decimal") {
		t.Errorf("fields %+v", r.Error.Fields)
	}

	esc := w.job("job-escape", map[string]messages.Vars{"t1": w.host(0)}, "escape.yml")
	w.submit(esc)
	r = w.waitJob("job-escape", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
	if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "source.repository" || !strings.Contains(r.Error.Fields[0].Message, "escape.yml") {
		t.Errorf("fields %+v", r.Error.Fields)
	}
	w.waitAcked(messages.StreamAnsibleJobQueue, time.Minute)
	if n := w.rdb.XLen(context.Background(), messages.StreamAnsibleJobQueue+stream.DeadLetterSuffix).Val(); n != 5 {
		t.Errorf("%d dead letters, want 5", n)
	}
}

// TestAnsibleJobUnauthorizedHostRefused: a job with one host outside the
// operator's networks and one at the metadata address is refused before
// any connection: no SSH attempt, not even to its authorized host.
func TestAnsibleJobUnauthorizedHostRefused(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	p := w.start()
	m := w.job("job-refused", map[string]messages.Vars{
		"ok":       w.host(0),
		"outside":  {"ansible_host": "198.51.100.7"},
		"metadata": {"ansible_host": "169.254.169.254"},
	}, "site.yml")
	w.submit(m)
	r := w.waitJob("job-refused", 3*time.Minute)
	jobStatus(t, r, messages.StatusUnreachable, messages.KindSSHUnreachable)
	if r.Hosts["outside"].Unreachable != 1 || r.Hosts["metadata"].Unreachable != 1 {
		t.Errorf("recap %+v, want the refused hosts unreachable", r.Hosts)
	}
	if _, ok := r.Hosts["ok"]; ok {
		t.Errorf("recap %+v names the authorized host, which never ran", r.Hosts)
	}
	if n := p.sshAttempts(t); n != 0 {
		t.Errorf("%v SSH attempts, want none", n)
	}
	if r.Commit != "" {
		t.Errorf("the source was fetched (%s) for a refused job", r.Commit)
	}
}

// TestAnsibleJobVaultPassword: vault-encrypted vars decrypt with the vault
// password given by reference; the password is never in a process's argv,
// infra's logs, the results, the rows, or a file left behind.
func TestAnsibleJobVaultPassword(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	canary := "vault-CANARY-" + testenv.Unique("pw")
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(canary), 0o600); err != nil {
		t.Fatal(err)
	}
	enc, err := exec.Command("ansible-vault", "encrypt_string", "--vault-password-file", pwFile,
		"--name", "secret_value", "the decrypted value").Output()
	if err != nil {
		t.Fatalf("ansible-vault: %v", err)
	}
	os.Remove(pwFile)
	w.repo.Commit(t, map[string]string{
		"vars/secret.yml": string(enc),
		"vault.yml": `- name: Vault
  hosts: all
  gather_facts: false
  vars_files: [vars/secret.yml]
  tasks:
    - name: Use the secret
      ansible.builtin.copy:
        content: "{{ secret_value | hash('sha256') }}"
        dest: "{{ out }}/{{ inventory_hostname }}.vault"
        mode: "0644"
    - name: Take a moment (argv is watched meanwhile)
      ansible.builtin.command: sleep 1
      changed_when: false
`,
	})
	p := w.start("PROJ_SECRET_VAULT=" + canary)
	var inArgv atomic.Bool
	stop := make(chan struct{})
	go watchArgv(canary, &inArgv, stop)
	m := w.job("job-vault", map[string]messages.Vars{"t1": w.host(0)}, "vault.yml")
	m.Credentials.VaultPassword = "env:PROJ_SECRET_VAULT"
	m.Options.Verbosity = 4
	w.submit(m)
	r := w.waitJob("job-vault", 3*time.Minute)
	close(stop)
	jobStatus(t, r, messages.StatusSucceeded, "")
	got, err := os.ReadFile(filepath.Join(w.out, "t1.vault"))
	if err != nil || len(got) != 64 {
		t.Fatalf("vaulted var not used: %q %v", got, err)
	}
	if inArgv.Load() {
		t.Error("the vault password was in a process's argv")
	}
	w.assertNowhere(t, p, map[string]string{"vault password": canary})
	for _, dir := range []string{w.runRoot, filepath.Dir(w.env[1][len("JOB_WORK_DIR="):])} {
		_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				if data, _ := os.ReadFile(path); strings.Contains(string(data), canary) {
					t.Errorf("file %s holds the vault password", path)
				}
			}
			return nil
		})
	}
}

// watchArgv sets found when any process's command line holds s.
func watchArgv(s string, found *atomic.Bool, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			if data, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(data), s) {
				found.Store(true)
			}
		}
	}
}

// TestAnsibleJobAndDeployNeverOverlap: a job on a registered server's
// address and port takes the server's lock: the deploy to it and the job
// run one after the other, never at once.
func TestAnsibleJobAndDeployNeverOverlap(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.addServer("web-1", w.sshds[0])
	w.repo.Commit(t, map[string]string{"slow.yml": slowPlay})
	w.control("web-1", map[string]any{"sleep": 2})
	w.start("STREAM_CONCURRENCY=4")
	w.deploy("deploy-1", w.sshds[0].Host, "", "")
	m := w.job("job-slow", map[string]messages.Vars{"web": w.host(0)}, "slow.yml")
	w.submit(m)
	jobStatus(t, w.waitJob("job-slow", 3*time.Minute), messages.StatusSucceeded, "")
	if r := w.waitDeploy("deploy-1"); r.Status != messages.StatusSucceeded {
		t.Fatalf("deploy: %s %+v", r.Status, r.Error)
	}
	deploys := w.spans("web-1")
	var job []float64
	for _, fs := range w.recordsIn(filepath.Join(w.out, "spans.log")) {
		v, _ := strconv.ParseFloat(fs[3], 64)
		job = append(job, v)
	}
	if len(deploys) != 1 || len(job) != 2 {
		t.Fatalf("spans: deploys %+v, job %v", deploys, job)
	}
	d := deploys[0]
	if d.start < job[1] && job[0] < d.end {
		t.Errorf("the job [%f, %f] and the deploy [%f, %f] overlapped on web-1", job[0], job[1], d.start, d.end)
	}
}

// meetPlay holds its host until the host named by the extra var other
// has arrived too: two jobs of it finish only when they run at once.
const meetPlay = `- name: Meet
  hosts: all
  gather_facts: false
  tasks:
    - name: Arrive, then wait for the other
      ansible.builtin.shell: >-
        touch {{ out }}/{{ inventory_hostname }}.here;
        for i in $(seq 600); do [ -e {{ out }}/{{ other }}.here ] && exit 0; sleep 0.1; done; exit 1
      changed_when: true
`

// TestAnsibleJobsBehindOneAddress: two hosts that are no registered server
// share an address (one machine's loopback here, a NAT or port forwarding
// in the field) on different SSH ports: each has its own lock, so two jobs
// on them run side by side (each waits until the other has started; one
// lock for the address would hold the second until the first gave up).
func TestAnsibleJobsBehindOneAddress(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 2)
	if w.sshds[0].Host != w.sshds[1].Host || w.sshds[0].Port == w.sshds[1].Port {
		t.Fatalf("targets at %s:%d and %s:%d: want one address, two ports", w.sshds[0].Host, w.sshds[0].Port, w.sshds[1].Host, w.sshds[1].Port)
	}
	w.repo.Commit(t, map[string]string{"meet.yml": meetPlay})
	w.start("STREAM_CONCURRENCY=4")
	for i, name := range []string{"a", "b"} {
		m := w.job("job-meet-"+name, map[string]messages.Vars{name: w.host(i)}, "meet.yml")
		m.Options.ExtraVars["other"] = map[string]string{"a": "b", "b": "a"}[name]
		w.submit(m)
	}
	for _, name := range []string{"a", "b"} {
		jobStatus(t, w.waitJob("job-meet-"+name, 2*time.Minute), messages.StatusSucceeded, "")
	}
}

// holdPlay holds its host for hold seconds and records in holds.log when
// its task started and how it ended (done, or term: stopped by SIGTERM;
// bash's $EPOCHREALTIME, so that the trap starts no process).
const holdPlay = `- name: Hold
  hosts: all
  gather_facts: false
  tasks:
    - name: Hold the host
      ansible.builtin.shell: >-
        trap 'echo "end {{ inventory_hostname }} $EPOCHREALTIME term" >> {{ out }}/holds.log; exit 143' TERM;
        echo "start {{ inventory_hostname }} $EPOCHREALTIME -" >> {{ out }}/holds.log;
        sleep {{ hold }} & wait $! || { echo "end {{ inventory_hostname }} $EPOCHREALTIME term" >> {{ out }}/holds.log; exit 143; };
        echo "end {{ inventory_hostname }} $EPOCHREALTIME done" >> {{ out }}/holds.log
      args:
        executable: /bin/bash
      changed_when: true
`

// holdHost submits job id of hold.yml (holdPlay) on sshd 0, holding it
// for seconds, waits until its task runs there and returns the path of
// holds.log.
func (w *jobWorld) holdHost(t *testing.T, id string, seconds int64) string {
	t.Helper()
	m := w.job(id, map[string]messages.Vars{"t1": w.host(0)}, "hold.yml")
	m.Options.ExtraVars["hold"] = seconds
	w.submit(m)
	holds := filepath.Join(w.out, "holds.log")
	testenv.WaitFor(t, 2*time.Minute, "the long task to run on the host", func() bool {
		_, err := os.Stat(holds)
		return err == nil
	})
	return holds
}

// TestAnsibleJobTakeoverAfterKilledReplica: a replica killed with -9 in
// the middle of a job's long task leaves that task running on the host.
// The next run on the host (here a second job; the first one, redelivered,
// is cancelled) stops it before its own play starts: the task ended by
// SIGTERM before any later task on the host started, and nothing of the
// killed run is left there.
func TestAnsibleJobTakeoverAfterKilledReplica(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.repo.Commit(t, map[string]string{"hold.yml": holdPlay})
	scope := scopeOf(t, w.sshds[0].Host, w.sshds[0])
	a := w.start()
	holds := w.holdHost(t, "job-killed", 300)
	a.Signal(syscall.SIGKILL)
	a.Wait(10 * time.Second)
	if len(markedProcesses(scope)) == 0 {
		t.Fatal("no process of the killed run on the host: nothing to take over")
	}
	if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindJob, "job-killed"), "test", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	b := w.start()
	m := w.job("job-next", map[string]messages.Vars{"t1": w.host(0)}, "hold.yml")
	m.Options.ExtraVars["hold"] = int64(1)
	w.submit(m)
	jobStatus(t, w.waitJob("job-next", 3*time.Minute), messages.StatusSucceeded, "")
	recs := w.recordsIn(holds)
	if len(recs) < 3 || recs[0][0] != "start" {
		t.Fatalf("holds.log = %v, want the killed task's start, its end, the next task", recs)
	}
	var killedEnd float64
	for _, r := range recs[1:] {
		ts, _ := strconv.ParseFloat(r[2], 64)
		switch {
		case killedEnd == 0 && r[0] == "end":
			if r[3] != "term" {
				t.Fatalf("the killed run's task ended %q, want term (stopped by the takeover): %v", r[3], recs)
			}
			killedEnd = ts
		case killedEnd == 0 && r[0] == "start":
			t.Fatalf("a task started on the host at %.3f while the killed run's was still running: %v", ts, recs)
		}
	}
	if killedEnd == 0 {
		t.Fatalf("the killed run's task never ended: %v", recs)
	}
	if left := markedProcesses(scope); len(left) != 0 {
		t.Errorf("processes of earlier runs left on the host: %v", left)
	}
	testenv.WaitFor(t, 10*time.Second, "the takeover's log line", func() bool {
		return strings.Contains(b.Stderr(), "takeover stopped")
	})
}

// recordsIn returns the four-field lines of a file.
func (e *e2e) recordsIn(path string) [][]string {
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(string(data), "\n") {
		if fs := strings.Fields(line); len(fs) == 4 {
			out = append(out, fs)
		}
	}
	return out
}

// TestAnsibleJobCancel: setting the job's cancel key stops its play, and
// so does the job's own time limit.
func TestAnsibleJobCancel(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.repo.Commit(t, map[string]string{"slow.yml": slowPlay})
	w.start()
	m := w.job("job-cancel", map[string]messages.Vars{"t1": w.host(0)}, "slow.yml")
	m.Options.ExtraVars["hold"] = int64(60)
	w.submit(m)
	testenv.WaitFor(t, 3*time.Minute, "the play to hold the host", func() bool {
		_, err := os.Stat(filepath.Join(w.out, "spans.log"))
		return err == nil
	})
	// The task on the host carries the job's marker, as a deploy's does.
	scope := scopeOf(t, w.sshds[0].Host, w.sshds[0]) // the deploy path's name of the host
	testenv.WaitFor(t, 3*time.Minute, "the job's task to run on its host, marked", func() bool {
		return len(markedProcesses(scope)) > 0
	})
	began := time.Now()
	if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindJob, "job-cancel"), "test", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := w.waitJob("job-cancel", 3*time.Minute)
	jobStatus(t, r, messages.StatusCancelled, messages.KindCancelled)
	if d := time.Since(began); d > 30*time.Second {
		t.Errorf("cancel took %s", d)
	}
	// Its task on the host was stopped with it (the cleanup ran before the
	// result), not left to sleep on.
	if left := markedProcesses(scope); len(left) != 0 {
		t.Errorf("processes of the cancelled job left on its host: %v", left)
	}

	// The job's own time limit stops it too. The limit leaves a loaded
	// machine time to start the play and its first task (3 s did not,
	// under make test's load), which holds the host for a minute.
	m = w.job("job-timeout", map[string]messages.Vars{"t1": w.host(0)}, "slow.yml")
	m.Options.ExtraVars["hold"] = int64(60)
	m.Options.TimeoutSeconds = 20
	began = time.Now()
	w.submit(m)
	r = w.waitJob("job-timeout", 3*time.Minute)
	jobStatus(t, r, messages.StatusFailed, messages.KindTimeout)
	if d := time.Since(began); d > 55*time.Second {
		t.Errorf("a 20 s limit stopped the job after %s", d)
	}
	// Stopped on its first task: the recap still has its host, and the
	// running task names it.
	if _, ok := r.Hosts["t1"]; !ok {
		t.Errorf("the timed-out job's recap %v has no t1", r.Hosts)
	}
	if r.FailedTask == nil || r.FailedTask.Host != "t1" || r.FailedTask.Name != "Hold the host" {
		t.Errorf("the timed-out job's failed task %+v, want Hold the host on t1", r.FailedTask)
	}
}

// TestAnsibleJobPools: each pool is its own stream, served by the replicas
// whose JOB_POOLS name it (two each here); a job id sent twice runs once.
// A pool belongs to the operator: a job of a project the pool is not
// granted to (JOB_POOL_PROJECTS) is rejected, and runs nothing.
func TestAnsibleJobPools(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 2)
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	owners := map[string][]string{"": {"infra-default-1", "infra-default-2"}, "gpu": {"infra-gpu-1", "infra-gpu-2"}}
	for pool, names := range owners {
		for _, name := range names {
			w.start("STREAM_CONSUMER_NAME="+name, "JOB_POOLS="+cmp.Or(pool, "default"), "JOB_POOL_PROJECTS=gpu="+jobProject)
		}
	}
	// Sent straight to the pool's stream (the deployer refuses it at
	// submit): infra checks again.
	const otherProject = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"
	intruder := w.job("job-pool-intruder", map[string]messages.Vars{"intruder": w.host(0)}, "site.yml")
	intruder.ProjectID, intruder.Options.Pool = otherProject, "gpu"
	w.submit(intruder)
	r := w.waitJob("job-pool-intruder", 3*time.Minute)
	jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
	if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "options.pool" || !strings.Contains(r.Error.Fields[0].Message, "JOB_POOL_PROJECTS") {
		t.Errorf("a job of another project on pool gpu: fields %+v, want options.pool refused", r.Error.Fields)
	}
	if _, err := os.Stat(filepath.Join(w.out, "intruder.a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused job ran its play: %v", err)
	}
	var ids []string
	for _, pool := range []string{"", "gpu"} {
		for i := range 2 {
			id := fmt.Sprintf("job-pool-%s-%d", pool, i)
			m := w.job(id, map[string]messages.Vars{"t1": w.host(i)}, "site.yml")
			m.Options.Pool = pool
			w.submit(m)
			ids = append(ids, id)
			if i == 0 {
				w.submit(m) // a duplicate: the same job
			}
		}
	}
	for _, id := range ids {
		r := w.waitJob(id, 3*time.Minute)
		jobStatus(t, r, messages.StatusSucceeded, "")
		run := w.run(id)
		if !slices.Contains(owners[r.Pool], run.Owner) || run.Stream != messages.AnsibleJobQueue(r.Pool) || run.Attempt != 1 {
			t.Errorf("job %s of pool %q ran on %s from %s (attempt %d)", id, r.Pool, run.Owner, run.Stream, run.Attempt)
		}
	}
	for _, pool := range []string{"", "gpu"} {
		w.waitAcked(messages.AnsibleJobQueue(pool), time.Minute)
		id := "job-pool-" + pool + "-0"
		rs := w.jobResults(id)
		if len(rs) != 2 || rs[0].StartedAt != rs[1].StartedAt || rs[0].Status != rs[1].Status {
			t.Errorf("%s sent twice: %d results %+v, want the one job's result twice", id, len(rs), rs)
		}
	}
}

// TestAnsibleJobGitAndURLInventories: a git inventory runs on its hosts; a
// URL inventory with a host outside the operator's networks is refused
// before any connection.
func TestAnsibleJobGitAndURLInventories(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	s := w.sshds[0]
	w.repo.Commit(t, map[string]string{
		"site.yml":      sitePlay,
		"inventory.ini": fmt.Sprintf("[web]\nt1 ansible_host=%s ansible_port=%d ansible_user=%s\n", s.Host, s.Port, s.User),
	})
	urlInv := fmt.Sprintf("[web]\nt1 ansible_host=%s ansible_port=%d\nfar ansible_host=198.51.100.9\n", s.Host, s.Port)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer inv-token" {
			http.Error(rw, "no", http.StatusUnauthorized)
			return
		}
		rw.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(rw, urlInv)
	}))
	t.Cleanup(srv.Close)
	p := w.start("PROJ_SECRET_INV=inv-token")

	m := w.job("job-git-inv", nil, "site.yml")
	m.Inventory = messages.JobInventory{Type: messages.InventoryGit, Repository: w.repo.URL, Path: "inventory.ini",
		Credential: "env:PROJ_SECRET_GIT"}
	m.Options.Limit = "web"
	w.submit(m)
	r := w.waitJob("job-git-inv", 3*time.Minute)
	jobStatus(t, r, messages.StatusSucceeded, "")
	if len(r.Hosts) != 1 || r.Hosts["t1"].Changed != 2 {
		t.Errorf("recap %+v, want t1 with two changes", r.Hosts)
	}
	if r.InventoryCommit == "" || r.InventoryCommit != r.Commit {
		t.Errorf("inventory_commit %q, want the repository's commit %q (the playbook's, same repository)", r.InventoryCommit, r.Commit)
	}
	attempts := p.sshAttempts(t)

	m = w.job("job-url-inv", nil, "site.yml")
	m.Inventory = messages.JobInventory{Type: messages.InventoryURL, URL: srv.URL + "/hosts.ini", Credential: "env:PROJ_SECRET_INV"}
	w.submit(m)
	r = w.waitJob("job-url-inv", 3*time.Minute)
	jobStatus(t, r, messages.StatusUnreachable, messages.KindSSHUnreachable)
	if r.Hosts["far"].Unreachable != 1 {
		t.Errorf("recap %+v, want the refused host unreachable", r.Hosts)
	}
	if n := p.sshAttempts(t); n != attempts {
		t.Errorf("%v SSH attempts during the refused job, want none", n-attempts)
	}
}

// TestAnsibleJobRoles: a role from a repository runs through a generated
// play with its role_vars; a collection's role is installed from an
// allowed Galaxy server with the job's Galaxy credential and runs.
func TestAnsibleJobRoles(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	role := "- name: Write the greeting\n  ansible.builtin.copy:\n    content: \"{{ greeting }}\"\n" +
		"    dest: \"{{ out }}/{{ inventory_hostname }}.{{ marker }}\"\n    mode: \"0644\"\n"
	w.repo.Commit(t, map[string]string{"roles/greet/tasks/main.yml": role})
	hub := sourcestest.NewGalaxyServer(t, "galaxy-token")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "web", "1.2.0", map[string]string{"roles/greet/tasks/main.yml": role}))
	infra := w.start("GALAXY_SERVERS=hub="+hub.URL, "GALAXY_ALLOW_HTTP=true", "PROJ_SECRET_GALAXY=galaxy-token")

	m := w.job("job-role", map[string]messages.Vars{"t1": w.host(0)})
	m.Source = messages.JobSource{Type: messages.SourceRole, Repository: w.repo.URL, RolePath: "roles/greet",
		GitCredential: "env:PROJ_SECRET_GIT", RoleVars: messages.Vars{"greeting": "{{ not templated }}", "marker": "role"}}
	w.submit(m)
	jobStatus(t, w.waitJob("job-role", 3*time.Minute), messages.StatusSucceeded, "")
	if got, err := os.ReadFile(filepath.Join(w.out, "t1.role")); err != nil || string(got) != "{{ not templated }}" {
		t.Errorf("role output %q %v, want the role var as data", got, err)
	}

	m = w.job("job-collection", map[string]messages.Vars{"t1": w.host(0)})
	m.Source = messages.JobSource{Type: messages.SourceCollectionRole, Collection: "acme.web", Role: "greet",
		Version: ">=1.0.0", GalaxyServer: hub.URL, RoleVars: messages.Vars{"greeting": "hi", "marker": "collection"}}
	m.Credentials.Galaxy = "env:PROJ_SECRET_GALAXY"
	w.submit(m)
	jobStatus(t, w.waitJob("job-collection", 3*time.Minute), messages.StatusSucceeded, "")
	if got, err := os.ReadFile(filepath.Join(w.out, "t1.collection")); err != nil || string(got) != "hi" {
		t.Errorf("collection role output %q %v", got, err)
	}
	if hub.Downloads() != 1 {
		t.Errorf("%d downloads from the Galaxy stand-in, want 1", hub.Downloads())
	}

	// The same collection again for the project: installed from infra's
	// cache of the project's installs, nothing downloaded.
	if err := os.Remove(filepath.Join(w.out, "t1.collection")); err != nil {
		t.Fatal(err)
	}
	again := w.job("job-collection-again", map[string]messages.Vars{"t1": w.host(0)})
	again.Source, again.Credentials = m.Source, m.Credentials
	w.submit(again)
	jobStatus(t, w.waitJob("job-collection-again", 3*time.Minute), messages.StatusSucceeded, "")
	if got, err := os.ReadFile(filepath.Join(w.out, "t1.collection")); err != nil || string(got) != "hi" {
		t.Errorf("collection role output of the second job %q %v", got, err)
	}
	if hub.Downloads() != 1 {
		t.Errorf("%d downloads from the Galaxy stand-in after a second job with the same collection, want 1", hub.Downloads())
	}
	// Every step of a job is in the step breakdown, once per job: the
	// job-only ones, and the pipeline's (a deploy's server lookup aside).
	metrics := infra.metrics(t)
	for _, step := range []string{"pickup", "decode", "inventory", "authorization", "locks", "checkout", "requirements",
		"playbooks", "run_record", "secrets", "ssh_check", "run_dir", "agent", "takeover", "process_start", "play",
		"log_store", "result"} {
		m := regexp.MustCompile(`autoprov_infra_job_step_seconds_count\{step="` + step + `"\} (\d+)`).FindStringSubmatch(metrics)
		if m == nil || m[1] != "3" {
			t.Errorf("step %s observed %v times, want 3 (one per job)", step, m)
		}
	}
}

// cloudPlugin is a dynamic inventory plugin (acme.cloud.static) that adds
// the hosts of its configuration when its cloud credential is there.
const cloudPlugin = `from __future__ import annotations
import os
from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r'''
name: static
short_description: hosts from its configuration file
description: hosts from its configuration file, for tests
options:
  plugin:
    description: this plugin
    required: true
    choices: ['acme.cloud.static']
  hosts:
    description: hosts, each with name, address, port and user
    type: list
    elements: dict
    default: []
  probe:
    description: paths whose presence the plugin reports (the sandbox test)
    type: list
    elements: str
    default: []
'''


class InventoryModule(BaseInventoryPlugin):
    NAME = 'acme.cloud.static'

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(('static.yml', 'static.yaml'))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        if os.environ.get('ACME_CLOUD_TOKEN') != 'cloud-secret':
            raise AnsibleParserError('acme cloud: no credential')
        self.inventory.add_group('cloud')
        for h in self.get_option('hosts'):
            self.inventory.add_host(h['name'], group='cloud')
            self.inventory.set_variable(h['name'], 'ansible_host', h['address'])
            self.inventory.set_variable(h['name'], 'ansible_port', h['port'])
            self.inventory.set_variable(h['name'], 'ansible_user', h['user'])
            for k, v in h.get('vars', {}).items():
                self.inventory.set_variable(h['name'], k, v)
            # What the plugin (the job's code, run by ansible-inventory on
            # infra's machine) is and sees.
            self.inventory.set_variable(h['name'], 'plugin_uid', os.getuid())
            self.inventory.set_variable(h['name'], 'plugin_procs', len([p for p in os.listdir('/proc') if p.isdigit()]))
            self.inventory.set_variable(h['name'], 'plugin_sees', [p for p in self.get_option('probe') if os.path.exists(p)])
`

// TestAnsibleJobDynamicInventory: a dynamic inventory plugin from a
// collection the source's requirements install (from the Galaxy stand-in),
// with the cloud credential by reference, lists the hosts; the play runs on
// them, by the group the plugin made.
func TestAnsibleJobDynamicInventory(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	s := w.sshds[0]
	hub := sourcestest.NewGalaxyServer(t, "")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "cloud", "1.0.0", map[string]string{"plugins/inventory/static.py": cloudPlugin}))
	// greet.yml writes the host's greeting, a variable only the plugin sets.
	greet := "- name: Greet\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: Greeting\n      ansible.builtin.copy:\n" +
		"        content: \"{{ greeting }}\"\n        dest: \"{{ out }}/{{ inventory_hostname }}.greeting\"\n        mode: \"0644\"\n"
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay, "greet.yml": greet, "collections/requirements.yml": "collections:\n  - name: acme.cloud\n"})
	w.start("GALAXY_SERVERS=hub="+hub.URL, "GALAXY_ALLOW_HTTP=true", "PROJ_SECRET_CLOUD=ACME_CLOUD_TOKEN=cloud-secret")
	m := w.job("job-dynamic", nil, "site.yml")
	job := m
	m.Inventory = messages.JobInventory{Type: messages.InventoryDynamic, Plugin: "acme.cloud.static",
		Config: messages.Vars{"hosts": []any{map[string]any{"name": "vm1", "address": s.Host, "port": int64(s.Port), "user": s.User,
			"vars": map[string]any{"greeting": "{{ not templated }}"}}}}}
	m.Credentials.Cloud = "env:PROJ_SECRET_CLOUD"
	m.Options.Limit = "cloud"
	w.submit(m)
	r := w.waitJob("job-dynamic", 3*time.Minute)
	jobStatus(t, r, messages.StatusSucceeded, "")
	if len(r.Hosts) != 1 || r.Hosts["vm1"].Changed != 2 {
		t.Errorf("recap %+v, want vm1 with two changes", r.Hosts)
	}

	// The plugin's host variables reach the play, as data; a connection
	// variable among them is refused before any connection.
	m = w.job("job-dynamic-vars", nil, "greet.yml")
	m.Inventory, m.Credentials.Cloud = job.Inventory, job.Credentials.Cloud
	w.submit(m)
	jobStatus(t, w.waitJob("job-dynamic-vars", 3*time.Minute), messages.StatusSucceeded, "")
	if got, err := os.ReadFile(filepath.Join(w.out, "vm1.greeting")); err != nil || string(got) != "{{ not templated }}" {
		t.Errorf("the plugin's host variable in the play: %q %v", got, err)
	}
	// The plugin is the job's code: it runs in the job's sandbox, as a
	// job user, seeing no process of infra's and none of its files.
	spy := "- name: Spy\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: Report\n      ansible.builtin.copy:\n" +
		"        content: \"{{ plugin_uid | int }} {{ plugin_procs | int }} [{{ plugin_sees | join(',') }}]\"\n        dest: \"{{ out }}/{{ inventory_hostname }}.spy\"\n        mode: \"0644\"\n"
	w.repo.Commit(t, map[string]string{"spy.yml": spy})
	m = w.job("job-dynamic-spy", nil, "spy.yml")
	m.Inventory, m.Credentials.Cloud = job.Inventory, job.Credentials.Cloud
	cacheDir := w.env[2][len("SOURCES_CACHE_DIR="):]
	m.Inventory.Config = messages.Vars{"hosts": job.Inventory.Config["hosts"], "probe": []any{cacheDir, w.e2e.factCache, "/etc/shadow", "/root"}}
	w.submit(m)
	jobStatus(t, w.waitJob("job-dynamic-spy", 3*time.Minute), messages.StatusSucceeded, "")
	got, err := os.ReadFile(filepath.Join(w.out, "vm1.spy"))
	var uid, procs int
	var sees string
	if _, serr := fmt.Sscanf(string(got), "%d %d %s", &uid, &procs, &sees); err != nil || serr != nil {
		t.Fatalf("the plugin's report: %q %v %v", got, err, serr)
	}
	if uid < 40000 || uid > 40999 || procs > 10 || sees != "[]" {
		t.Errorf("the inventory plugin ran as uid %d seeing %d processes and %s; want a job user (40000-40999), its own few processes, none of infra's paths", uid, procs, sees)
	}

	m = w.job("job-dynamic-conn", nil, "greet.yml")
	m.Inventory, m.Credentials.Cloud = job.Inventory, job.Credentials.Cloud
	m.Inventory.Config = messages.Vars{"hosts": []any{map[string]any{"name": "vm1", "address": s.Host, "port": int64(s.Port), "user": s.User,
		"vars": map[string]any{"greeting": "hi", "ansible_shell_executable": "/tmp/x"}}}}
	w.submit(m)
	if r := w.waitJob("job-dynamic-conn", 3*time.Minute); r.Status != messages.StatusRejected ||
		!strings.Contains(fmt.Sprint(r.Error), "ansible_shell_executable") {
		t.Errorf("a plugin's connection variable: %s %+v, want rejected naming it", r.Status, r.Error)
	}
}

// TestAnsibleJobRejectedKeySaysSo: a job whose SSH key its hosts refuse
// ends failed with ssh_auth_failed naming the hosts and the login user, not
// "none of the hosts answered SSH"; hosts that do not answer at all stay
// hosts_unreachable.
func TestAnsibleJobRejectedKeySaysSo(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 2)
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	stranger, _ := testenv.NewSSHKey(t, "ed25519")
	w.start("PROJ_SECRET_STRANGER=" + string(stranger))

	m := w.job("job-wrong-key", map[string]messages.Vars{"t1": w.host(0), "t2": w.host(1)}, "site.yml")
	m.Credentials.SSH = "env:PROJ_SECRET_STRANGER"
	w.submit(m)
	r := w.waitJob("job-wrong-key", 3*time.Minute)
	jobStatus(t, r, messages.StatusFailed, messages.KindSSHAuthFailed)
	for _, want := range []string{"t1: ", "t2: ", w.sshds[0].User + "@", "rejected our SSH key"} {
		if !strings.Contains(r.Error.Message, want) {
			t.Errorf("message %q lacks %q", r.Error.Message, want)
		}
	}
	if r.Hosts["t1"].Unreachable != 1 || r.Hosts["t2"].Unreachable != 1 {
		t.Errorf("recap %+v, want both hosts unreachable", r.Hosts)
	}

	dead := w.job("job-dead-hosts", map[string]messages.Vars{"d1": w.deadHost(t)}, "site.yml")
	w.submit(dead)
	r = w.waitJob("job-dead-hosts", 3*time.Minute)
	jobStatus(t, r, messages.StatusUnreachable, messages.KindHostsUnreachable)
	if !strings.Contains(r.Error.Message, "d1: ") {
		t.Errorf("message %q does not name the host", r.Error.Message)
	}
}

// TestAnsibleJobWaitsBeforeItsCheckout: a job whose host another job holds
// waits (it comes back again and again) without fetching its repository;
// it fetches once its host is free, and runs after the first.
func TestAnsibleJobWaitsBeforeItsCheckout(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.repo.Commit(t, map[string]string{"hold.yml": holdPlay})
	p := w.start("SERVER_BUSY_RECHECK=200ms")
	holds := w.holdHost(t, "job-holder", 8)
	fetched := w.git.Authorized.Load()
	second := w.job("job-waiter", map[string]messages.Vars{"t1": w.host(0)}, "hold.yml")
	second.Options.ExtraVars["hold"] = int64(0)
	w.submit(second)
	// While the first holds the host, the second looks every 200 ms.
	testenv.WaitFor(t, time.Minute, "the second job to wait for the host", func() bool {
		n := 0
		for line := range strings.Lines(p.Stderr()) {
			if strings.Contains(line, `"job_id":"job-waiter"`) && strings.Contains(line, "waiting for another run") {
				n++
			}
		}
		return n >= 3
	})
	if r := w.jobResults("job-holder"); len(r) == 0 {
		if n := w.git.Authorized.Load() - fetched; n != 0 {
			t.Errorf("the waiting job fetched its repository %d times (requests) while its host was busy, want 0", n)
		}
	}
	jobStatus(t, w.waitJob("job-holder", 3*time.Minute), messages.StatusSucceeded, "")
	jobStatus(t, w.waitJob("job-waiter", 3*time.Minute), messages.StatusSucceeded, "")
	if recs := w.recordsIn(holds); len(recs) != 4 || recs[1][0] != "end" || recs[2][0] != "start" {
		t.Errorf("holds.log = %v, want the first job's task, then the second's", recs)
	}
}

// TestAnsibleJobWaitingPreparesOnce: jobs whose hosts another job holds
// keep what they prepared while they wait and look again and again: a
// dynamic inventory's job (its source checked out and its requirements
// installed first, the plugin's listing, then its host found busy) and a
// git inventory's (the inventory fetched, then its host found busy) fetch
// nothing more from git or Galaxy until they run; when their hosts are
// free they run, once each, and leave no directory behind.
func TestAnsibleJobWaitingPreparesOnce(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 2)
	a, b := w.sshds[0], w.sshds[1]
	hub := sourcestest.NewGalaxyServer(t, "")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "cloud", "1.0.0", map[string]string{"plugins/inventory/static.py": cloudPlugin}))
	w.repo.Commit(t, map[string]string{
		"hold.yml": holdPlay, "site.yml": sitePlay, "collections/requirements.yml": "collections:\n  - name: acme.cloud\n",
		"inventory.ini": fmt.Sprintf("[web]\nt2 ansible_host=%s ansible_port=%d ansible_user=%s\n", b.Host, b.Port, b.User),
	})
	workDir := filepath.Join(filepath.Dir(w.e2e.runRoot), "jobs")
	p := w.start("SERVER_BUSY_RECHECK=200ms", "GALAXY_SERVERS=hub="+hub.URL, "GALAXY_ALLOW_HTTP=true",
		"PROJ_SECRET_CLOUD=ACME_CLOUD_TOKEN=cloud-secret")

	holder := w.job("job-holder", map[string]messages.Vars{"t1": w.host(0), "t2": w.host(1)}, "hold.yml")
	holder.Options.ExtraVars["hold"] = int64(30)
	w.submit(holder)
	holds := filepath.Join(w.out, "holds.log")
	testenv.WaitFor(t, 2*time.Minute, "the holder's task to run on both hosts", func() bool {
		got, _ := os.ReadFile(holds)
		return strings.Count(string(got), "start ") == 2
	})

	dynamic := w.job("job-dynamic-waiter", nil, "site.yml")
	dynamic.Inventory = messages.JobInventory{Type: messages.InventoryDynamic, Plugin: "acme.cloud.static",
		Config: messages.Vars{"hosts": []any{map[string]any{"name": "t1", "address": a.Host, "port": int64(a.Port), "user": a.User}}}}
	dynamic.Credentials.Cloud = "env:PROJ_SECRET_CLOUD"
	gitInv := w.job("job-git-waiter", nil, "site.yml")
	gitInv.Inventory = messages.JobInventory{Type: messages.InventoryGit, Repository: w.repo.URL, Path: "inventory.ini",
		Credential: "env:PROJ_SECRET_GIT"}
	w.submit(dynamic)
	w.submit(gitInv)
	looks := func(id string) int {
		n := 0
		for line := range strings.Lines(p.Stderr()) {
			if strings.Contains(line, `"job_id":"`+id+`"`) && strings.Contains(line, "waiting for another run") {
				n++
			}
		}
		return n
	}
	waiting := func(n int) func() bool {
		return func() bool { return looks("job-dynamic-waiter") >= n && looks("job-git-waiter") >= n }
	}
	testenv.WaitFor(t, 2*time.Minute, "both jobs to find their hosts busy", waiting(1))
	fetched, downloads := w.git.Authorized.Load(), hub.Downloads()
	testenv.WaitFor(t, 2*time.Minute, "both jobs to look again three times", waiting(4))
	if len(w.jobResults("job-holder")) != 0 {
		t.Fatal("the holder finished before the waiters looked again: hold it longer")
	}
	if n := w.git.Authorized.Load() - fetched; n != 0 {
		t.Errorf("the waiting jobs made %d more git requests while their hosts were busy, want 0 (prepared once)", n)
	}
	if n := hub.Downloads() - downloads; n != 0 {
		t.Errorf("the waiting jobs downloaded %d more collections while their hosts were busy, want 0", n)
	}
	if downloads != 1 {
		t.Errorf("%d downloads from the Galaxy stand-in for one requirements set, want 1", downloads)
	}

	jobStatus(t, w.waitJob("job-holder", 3*time.Minute), messages.StatusSucceeded, "")
	for _, id := range []string{"job-dynamic-waiter", "job-git-waiter"} {
		r := w.waitJob(id, 3*time.Minute)
		jobStatus(t, r, messages.StatusSucceeded, "")
		if id == "job-git-waiter" && (r.InventoryCommit == "" || r.Commit != r.InventoryCommit) {
			t.Errorf("%s: commit %q, inventory commit %q, want both the repository's (kept from its first look)", id, r.Commit, r.InventoryCommit)
		}
		if rs := w.jobResults(id); len(rs) != 1 {
			t.Errorf("%s: %d results, want 1", id, len(rs))
		}
	}
	testenv.WaitFor(t, time.Minute, "no job directory left", func() bool {
		left, _ := filepath.Glob(filepath.Join(workDir, "job-*"))
		return len(left) == 0
	})
}
