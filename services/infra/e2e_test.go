package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestProvisionSucceeds(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	varsFile := filepath.Join(t.TempDir(), "site.json")
	if err := os.WriteFile(varsFile, []byte(`{"site_marker": "from-site", "autoprov_deploy_user": "site-user"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.infra("PLAYBOOK_VARS_FILE=" + varsFile)

	before := e.server("web-1")
	e.provision("job-ok", "web-1")
	r := e.waitProvision("job-ok", 3*time.Minute)

	if r.Status != messages.StatusSucceeded || r.Error != nil {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
	if r.ServerHandle != "web-1" || r.Playbook != "setup_server.yml" || r.Attempt != 1 || r.RequestID == "" {
		t.Errorf("result identifiers: %+v", r.Outcome)
	}
	if h := r.Hosts["web-1"]; h.Ok+h.Changed == 0 || h.Failed != 0 {
		t.Errorf("host recap = %+v", r.Hosts)
	}
	s := e.server("web-1")
	if s.Status != store.ServerReady || s.HostKey == "" || s.Version <= before.Version || s.LastJobID != "job-ok" {
		t.Errorf("server after run: status=%s host_key=%q version=%d last_job=%s", s.Status, s.HostKey, s.Version, s.LastJobID)
	}
	// No scheduler here (a request published to infra directly): infra
	// alone leaves the server right, with one history row per change.
	if got, want := e.history("web-1"), []string{"transition NEW->PROVISIONING by infra", "result PROVISIONING->READY by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	if !strings.HasPrefix(s.HostKey, strings.Fields(sshd.HostKey)[0]) || !strings.Contains(s.HostKey, strings.Fields(sshd.HostKey)[1]) {
		t.Errorf("pinned %q, the server's key is %q", s.HostKey, sshd.HostKey)
	}
	run := e.run("job-ok")
	if run.State != store.RunDone || run.Status != "succeeded" || run.Attempt != 1 {
		t.Errorf("run row = %+v", run)
	}
	// The stored result is the published one, byte for byte.
	published := e.results(messages.StreamProvisionerResults)
	if len(published) != 1 || published[0].Values["data"].(string) != string(run.Result) {
		t.Errorf("stored result differs from the published one")
	}
	// Setup got the public half of our key for the deploy user.
	pub, _ := os.ReadFile(filepath.Join(e.ansibleDir, "out", "web-1.pubkey"))
	if !strings.HasPrefix(string(pub), "ssh-ed25519 ") {
		t.Errorf("setup received public key %q", pub)
	}
	// Site vars reach the play; the job's own vars win over them.
	vars, _ := os.ReadFile(filepath.Join(e.ansibleDir, "out", "web-1.vars.json"))
	if string(vars) != `{"deploy_user": "root", "site_marker": "from-site"}` && string(vars) != `{"site_marker": "from-site", "deploy_user": "root"}` {
		t.Errorf("vars seen by the play: %s", vars)
	}
	// Progress went out on the job's stream, in order, ending with the status.
	evs := progressEvents(t, e.rdb, "job-ok")
	if len(evs) < 4 || evs[0].Type != messages.EventRunStarted || evs[len(evs)-1].Type != messages.EventRunFinished ||
		evs[len(evs)-1].Status != messages.StatusSucceeded {
		t.Fatalf("progress events = %+v", evs)
	}
	if !hasEvent(evs, messages.EventTaskStarted, "Log the start of the run") {
		t.Errorf("no task_started event for the playbook's tasks: %+v", evs)
	}
	if ttl := e.rdb.TTL(context.Background(), messages.ProgressStream(messages.JobKindProvision, "job-ok")).Val(); ttl <= 0 {
		t.Errorf("progress stream has no expiry (ttl %v)", ttl)
	}
	// Nothing is left behind, the entry was acknowledged, metrics counted it.
	assertRunRootEmpty(t, e.runRoot)
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	m := p.metrics(t)
	if !strings.Contains(m, `autoprov_infra_jobs_total{kind="provision",playbook="setup_server.yml",status="succeeded"} 1`) {
		t.Errorf("jobs metric missing:\n%s", grepLines(m, "autoprov_infra_jobs_total"))
	}
}

func TestFailingTaskIsReportedAndNotRetried(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"fail": true})
	e.infra()

	e.provision("job-fail", "web-1")
	r := e.waitProvision("job-fail", 3*time.Minute)
	if r.Status != messages.StatusFailed || r.Error == nil || r.Error.Kind != messages.KindPlaybookFailed {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
	if r.FailedTask == nil || r.FailedTask.Name != "Planned failure" || r.FailedTask.Host != "web-1" ||
		!strings.Contains(r.FailedTask.Message, "failing as control") {
		t.Fatalf("failed task = %+v", r.FailedTask)
	}
	if r.Hosts["web-1"].Failed != 1 || r.OutputTail == "" {
		t.Errorf("hosts = %+v, output tail %q", r.Hosts, r.OutputTail)
	}
	s := e.server("web-1")
	if s.Status != store.ServerFailed || !strings.Contains(s.LastError, "setup_server.yml") || s.Attempts != 1 {
		t.Errorf("server = status %s, last_error %q, attempts %d", s.Status, s.LastError, s.Attempts)
	}
	if got, want := e.history("web-1"), []string{"transition NEW->PROVISIONING by infra", "result PROVISIONING->FAILED by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	// No automatic retry: one run, one result, nothing pending, no dead
	// letter. Once acknowledged, the entry is never delivered again.
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	if spans := e.spans("web-1"); len(spans) != 1 || spans[0].end != 0 {
		t.Errorf("runs on the server: %+v, want exactly one that failed", spans)
	}
	if n := len(e.provisionResults("job-fail")); n != 1 {
		t.Errorf("%d results, want 1", n)
	}
	if n := pendingOf(t, e.rdb, messages.StreamProvisionerQueue); n != 0 {
		t.Errorf("%d entries pending", n)
	}
	if n := e.rdb.XLen(context.Background(), messages.StreamProvisionerQueue+":dead").Val(); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

func TestUnreachableServerIsMarkedAndNothingRuns(t *testing.T) {
	t.Parallel()
	e := newE2E(t, testenv.StartSSHD(t, testenv.SSHDOptions{}))
	port := testenv.ClosedPort(t)
	if _, err := e.pool.Exec(context.Background(),
		`INSERT INTO servers (handle, address, ssh_port) VALUES ('down-1', '127.0.0.1', $1)`, port); err != nil {
		t.Fatal(err)
	}
	p := e.infra()
	e.provision("job-down", "down-1")
	r := e.waitProvision("job-down", 3*time.Minute)
	if r.Status != messages.StatusUnreachable || r.Error == nil || r.Error.Kind != messages.KindSSHUnreachable {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
	s := e.server("down-1")
	if s.Status != store.ServerUnreachable || !strings.Contains(s.LastError, "did not answer SSH") || s.Attempts != 1 {
		t.Errorf("server = %s %q attempts %d", s.Status, s.LastError, s.Attempts)
	}
	if got, want := e.history("down-1"), []string{"transition NEW->PROVISIONING by infra", "result PROVISIONING->UNREACHABLE by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	if spans := e.spans("down-1"); len(spans) != 0 {
		t.Errorf("a play ran on an unreachable server: %+v", spans)
	}
	// Three attempts, with growing delays between them.
	var delays []int
	for _, line := range strings.Split(p.Stderr(), "\n") {
		if strings.Contains(line, `"message":"ssh check attempt"`) {
			var rec struct {
				Attempt int `json:"attempt"`
				DelayMS int `json:"delay_ms"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil {
				delays = append(delays, rec.DelayMS)
			}
		}
	}
	if len(delays) != 3 || !(delays[0] < delays[1] && delays[1] < delays[2]) {
		t.Errorf("attempt delays %v, want 3 growing ones", delays)
	}
	if m := p.metrics(t); !strings.Contains(m, `autoprov_ssh_attempts_total{result="refused"} 3`) {
		t.Errorf("ssh attempts metric:\n%s", grepLines(m, "autoprov_ssh_attempts_total"))
	}
}

func TestChangedHostKeyFailsClearly(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra()
	e.provision("job-1", "web-1")
	if r := e.waitProvision("job-1", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("first run: %s %+v", r.Status, r.Error)
	}
	pinned := e.server("web-1").HostKey

	sshd.RotateHostKey()
	e.provision("job-2", "web-1")
	r := e.waitProvision("job-2", 3*time.Minute)
	if r.Status != messages.StatusFailed || r.Error == nil || r.Error.Kind != messages.KindHostKeyMismatch {
		t.Fatalf("after the key changed: %s %+v", r.Status, r.Error)
	}
	if !strings.Contains(r.Error.Message, "SHA256:") {
		t.Errorf("message does not name the fingerprints: %q", r.Error.Message)
	}
	s := e.server("web-1")
	if s.Status != store.ServerFailed || s.HostKey != pinned {
		t.Errorf("server = %s, pinned key changed: %v", s.Status, s.HostKey != pinned)
	}
	if spans := e.spans("web-1"); len(spans) != 1 {
		t.Errorf("%d runs, want only the first", len(spans))
	}
}

func TestTwoRequestsForOneServerNeverRunTogether(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"sleep": 2})
	// Two instances, each free to take both requests.
	e.infra()
	e.infra()
	e.provision("job-a", "web-1")
	e.provision("job-b", "web-1", func(m *messages.ProvisionerMessage) { m.IsRecovery = true })
	// One after the other in no set order: the second waits for the
	// first's play (50 s on a loaded CI machine) before its own.
	for _, id := range []string{"job-a", "job-b"} {
		if r := e.waitProvision(id, 5*time.Minute); r.Status != messages.StatusSucceeded {
			t.Fatalf("%s: %s %+v", id, r.Status, r.Error)
		}
	}
	spans := e.spans("web-1")
	if len(spans) != 2 || spans[0].end == 0 || spans[1].end == 0 {
		t.Fatalf("runs = %+v, want two complete ones", spans)
	}
	assertNoOverlap(t, spans)
}

func TestKilledInfraRunIsTakenOverOnce(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"sleep": 6})
	a := e.infra()
	e.provision("job-k", "web-1")
	testenv.WaitFor(t, 3*time.Minute, "the run to start on the server", func() bool { return len(e.spans("web-1")) == 1 })

	a.Signal(syscall.SIGKILL)
	a.Wait(10 * time.Second)
	// The guard kills the play with its infra process: nothing of it lives on.
	testenv.WaitFor(t, 10*time.Second, "the killed instance's play to die", func() bool {
		return len(processesMentioning(e.runRoot)) == 0
	})
	killedAt := time.Now()

	b := e.infra()
	r := e.waitProvision("job-k", 3*time.Minute)
	if r.Status != messages.StatusSucceeded || r.Attempt != 2 {
		t.Fatalf("result = %s attempt %d %+v", r.Status, r.Attempt, r.Error)
	}
	t.Logf("taken over and finished %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	// Once acknowledged, the entry is never delivered again: no second run.
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	if n := len(e.provisionResults("job-k")); n != 1 {
		t.Errorf("%d results, want exactly 1", n)
	}
	spans := e.spans("web-1")
	if len(spans) != 2 || spans[0].end != 0 || spans[1].end == 0 {
		t.Fatalf("runs = %+v, want the killed one unfinished and one complete", spans)
	}
	assertNoOverlap(t, spans)
	if !strings.Contains(b.Stderr(), "taking over a run whose previous owner stopped") {
		t.Error("the takeover was not logged")
	}
	if run := e.run("job-k"); run.Attempt != 2 || run.Status != "succeeded" {
		t.Errorf("run = %+v", run)
	}
	assertRunRootEmpty(t, e.runRoot)
}

func TestBadMessagesAreRejectedAndDeadLettered(t *testing.T) {
	t.Parallel()
	e := newE2E(t, nil)
	p := e.infra()
	ctx := context.Background()
	// Not msgpack at all, a request missing its server handle, and a deploy
	// with several invalid fields.
	garbage := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerQueue, Values: map[string]any{"data": "\xc1not msgpack"}}).Val()
	e.publish(messages.StreamProvisionerQueue, &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: "job-bad"}})
	e.publish(messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "deploy-bad"}, ProjectID: "not-a-uuid", RepoFullName: "x", ServerIP: "999.1.1.1", Port: 70000,
	})
	testenv.WaitFor(t, 30*time.Second, "three dead letters", func() bool {
		return e.rdb.XLen(ctx, messages.StreamProvisionerQueue+":dead").Val() == 2 &&
			e.rdb.XLen(ctx, messages.StreamAnsibleDeployQueue+":dead").Val() == 1
	})
	rs := e.provisionResults("job-bad")
	if len(rs) != 1 || rs[0].Status != messages.StatusRejected || rs[0].Error.Kind != messages.KindInvalidMessage ||
		len(rs[0].Error.Fields) == 0 || rs[0].Error.Fields[0].Field != "server_handle" {
		t.Fatalf("rejection of job-bad = %+v", rs)
	}
	if rs := e.provisionResults(garbage); len(rs) != 1 || rs[0].Status != messages.StatusRejected {
		t.Errorf("undecodable entry: results %+v (job id = its entry id)", rs)
	}
	ds := e.deployResults("deploy-bad")
	if len(ds) != 1 || ds[0].Status != messages.StatusRejected {
		t.Fatalf("deploy rejection = %+v", ds)
	}
	fields := map[string]bool{}
	for _, f := range ds[0].Error.Fields {
		fields[f.Field] = true
	}
	for _, f := range []string{"project_id", "repo_full_name", "server_ip", "port"} {
		if !fields[f] {
			t.Errorf("field %s not reported: %+v", f, ds[0].Error.Fields)
		}
	}
	dead := e.rdb.XRange(ctx, messages.StreamProvisionerQueue+":dead", "-", "+").Val()
	if dead[0].Values["dead_reason"] != "invalid_message" {
		t.Errorf("dead letter = %v", dead[0].Values)
	}
	p.WaitHTTP("http://"+p.admin+"/healthz", 200, 5*time.Second)
	if n := pendingOf(t, e.rdb, messages.StreamProvisionerQueue); n != 0 {
		t.Errorf("%d entries pending", n)
	}
}

func TestCancelStopsTheRunAndItsProcesses(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"sleep": 60})
	e.infra()
	e.provision("job-c", "web-1")
	testenv.WaitFor(t, 3*time.Minute, "the run to start", func() bool { return len(e.spans("web-1")) == 1 })
	if err := e.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindProvision, "job-c"), "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.waitProvision("job-c", 30*time.Second)
	if r.Status != messages.StatusCancelled || r.Error == nil || r.Error.Kind != messages.KindCancelled {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
	testenv.WaitFor(t, 10*time.Second, "the play's processes to be gone", func() bool {
		return len(playProcesses(e.runRoot)) == 0 && len(processesMentioning("sleep 60")) == 0
	})
	assertRunRootEmpty(t, e.runRoot)
}

func TestTimeLimitsStopStuckRuns(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, limits string
		kind         messages.ErrorKind
	}{
		{"idle", "setup_server.yml:1m/2s", messages.KindIdleTimeout},
		{"wall-clock", "setup_server.yml:3s/1m", messages.KindTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
			e := newE2E(t, sshd)
			e.addServer("web-1", sshd)
			e.control("web-1", map[string]any{"sleep": 30})
			e.infra("PLAYBOOK_TIMEOUTS=" + tt.limits)
			e.provision("job-t", "web-1")
			r := e.waitProvision("job-t", 3*time.Minute)
			if r.Status != messages.StatusFailed || r.Error == nil || r.Error.Kind != tt.kind {
				t.Fatalf("result = %s %+v", r.Status, r.Error)
			}
			testenv.WaitFor(t, 10*time.Second, "the play's processes to be gone", func() bool {
				return len(processesMentioning(e.runRoot)) == 0
			})
			if s := e.server("web-1"); s.Status != store.ServerFailed {
				t.Errorf("server = %s", s.Status)
			}
		})
	}
}

func TestRedeliveredFinishedJobRepublishesItsResult(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra()
	e.provision("job-r", "web-1")
	first := e.waitProvision("job-r", 3*time.Minute)
	// The producer sends the same job again (a retry after a timeout, or
	// go-redis repeating an XADD): it is not run again.
	e.provision("job-r", "web-1")
	testenv.WaitFor(t, 30*time.Second, "the second result", func() bool { return len(e.provisionResults("job-r")) == 2 })
	rs := e.provisionResults("job-r")
	if rs[0].StartedAt != rs[1].StartedAt || rs[1].Status != first.Status || rs[1].RequestID != first.RequestID {
		t.Errorf("republished result differs: %+v vs %+v", rs[0].Outcome, rs[1].Outcome)
	}
	if spans := e.spans("web-1"); len(spans) != 1 {
		t.Errorf("%d runs, want 1", len(spans))
	}
}

func TestUnknownServerIsRejected(t *testing.T) {
	t.Parallel()
	e := newE2E(t, nil)
	e.infra()
	e.provision("job-x", "no-such-server")
	r := e.waitProvision("job-x", 30*time.Second)
	if r.Status != messages.StatusRejected || r.Error.Kind != messages.KindServerNotFound {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
}

// progressEvents reads a provisioning job's progress stream.
func progressEvents(t *testing.T, rdb *redis.Client, jobID string) []*messages.ProgressEvent {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), messages.ProgressStream(messages.JobKindProvision, jobID), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []*messages.ProgressEvent
	for _, m := range msgs {
		ev, err := messages.DecodeProgressEvent([]byte(m.Values["data"].(string)))
		if err != nil {
			t.Fatalf("progress event %s: %v", m.ID, err)
		}
		out = append(out, ev)
	}
	for i, ev := range out {
		if ev.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.Seq)
		}
	}
	return out
}

func hasEvent(evs []*messages.ProgressEvent, typ messages.EventType, task string) bool {
	for _, ev := range evs {
		if ev.Type == typ && ev.Task == task {
			return true
		}
	}
	return false
}

func pendingOf(t *testing.T, rdb *redis.Client, s string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), s, "infra").Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// assertRunRootEmpty checks that no run directory was left behind.
func assertRunRootEmpty(t *testing.T, root string) {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	warm := strings.Contains(os.Getenv("INFRA_TEST_ENV"), "SSH_WARM_CONNECTIONS=true")
	for _, e := range entries {
		if warm && strings.HasPrefix(e.Name(), "ar-w") {
			continue // a warm connection's, while infra runs (warm_test.go)
		}
		t.Errorf("left behind in the run root: %s", e.Name())
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// history is the server's history, oldest first, as "event FROM->TO by actor".
func (e *e2e) history(handle string) []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT event || ' ' || COALESCE(from_status, '') || '->' || to_status || ' by ' || actor
		FROM server_history WHERE handle = $1 ORDER BY id`, handle)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}
