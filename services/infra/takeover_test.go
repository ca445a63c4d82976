package main

import (
	"bytes"
	"context"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// hold is the long task of one run of hold.yml, from the target's own
// record (out/<host>.hold.log): when its process started and ended, and the
// marker of the run it belongs to.
type hold struct {
	token    string
	marker   string  // AUTOPROV_RUN of the long task
	start    float64 // "hold"
	end      float64 // the first "release"; 0: never
	released string  // how it ended: done, term, "" (never)
}

// holds reads the target's hold records of host, in order of start.
func (e *e2e) holds(host string) []hold {
	e.t.Helper()
	byToken := map[string]*hold{}
	var order []string
	for _, fs := range e.records(host + ".hold.log") {
		ts, _ := strconv.ParseFloat(fs[2], 64)
		h := byToken[fs[1]]
		if h == nil {
			h = &hold{token: fs[1]}
			byToken[fs[1]] = h
			order = append(order, fs[1])
		}
		switch {
		case fs[0] == "hold":
			h.start, h.marker = ts, fs[3]
		case fs[0] == "release" && h.released == "": // the first one counts
			h.end, h.released = ts, fs[3]
		}
	}
	out := make([]hold, 0, len(order))
	for _, k := range order {
		out = append(out, *byToken[k])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// markedProcesses returns the live processes on this machine (the target)
// carrying a marker of the runs against scope.
func markedProcesses(scope string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			continue
		}
		if bytes.Contains(env, []byte("AUTOPROV_RUN="+scope+".")) {
			if st, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat")); err == nil {
				if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
					continue
				}
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

// scopeOf is the marker scope of the runs against a test server.
func scopeOf(t *testing.T, handle string, sshd *testenv.SSHD) string {
	t.Helper()
	scope, err := ansible.RemoteScope(ansible.Host{Alias: handle, Address: sshd.Host, Port: sshd.Port, User: sshd.User, KnownHostsKey: sshd.HostKey})
	if err != nil {
		t.Fatal(err)
	}
	return scope
}

func holdRequest(m *messages.ProvisionerMessage) { m.Playbooks = []string{"hold.yml"} }

// A replica killed with -9 in the middle of a long remote task leaves that
// task running on the server (nothing there notices). The replica that
// takes the request over (after the lease) stops it before its own play
// starts: the target's own record shows the killed run's task ended (by
// SIGTERM) before the next run started, and no process of the killed run
// is left.
func TestKilledControllerRemoteTaskStoppedBeforeTakeover(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	scope := scopeOf(t, "web-1", sshd)
	e.control("web-1", map[string]any{"hold": 300})

	a := e.infra()
	e.provision("job-k", "web-1", holdRequest)
	testenv.WaitFor(t, 2*time.Minute, "the long task to run on the server", func() bool {
		return len(e.holds("web-1")) == 1
	})
	a.Signal(syscall.SIGKILL)
	a.Wait(10 * time.Second)
	// The controller is gone; its task on the server is not.
	killed := e.holds("web-1")[0]
	if killed.released != "" {
		t.Fatalf("the long task ended with its controller (%+v): nothing to take over", killed)
	}
	if len(markedProcesses(scope)) == 0 {
		t.Fatalf("no process of the killed run on the server")
	}

	e.control("web-1", map[string]any{"hold": 1}) // the run that takes over is short
	b := e.infra()
	r := e.waitProvision("job-k", 3*time.Minute)
	if r.Status != messages.StatusSucceeded || r.Attempt < 2 {
		t.Fatalf("result %s attempt %d %+v, want succeeded on attempt 2 or later", r.Status, r.Attempt, r.Error)
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)

	hs := e.holds("web-1")
	if len(hs) != 2 {
		t.Fatalf("long tasks on the server = %+v, want the killed run's and the one that took over", hs)
	}
	first, second := hs[0], hs[1]
	if first.token != killed.token || first.released != "term" {
		t.Errorf("killed run's task = %+v, want it stopped by SIGTERM", first)
	}
	if second.released != "done" || second.marker == first.marker {
		t.Errorf("second run's task = %+v, want its own marker and a complete task", second)
	}
	// Every playbook run that started after the killed run's long task
	// (the takeover run's setup_server and hold) started after that task's
	// process ended.
	var later int
	for _, s := range e.spans("web-1") {
		if s.start > first.start {
			later++
			if first.end == 0 || s.start < first.end {
				t.Errorf("runs overlapped on the server: %s (%s) started at %.3f, the killed run's task ended at %.3f",
					s.playbook, s.token, s.start, first.end)
			}
		}
	}
	if later != 2 {
		t.Errorf("%d playbook runs after the killed one, want 2 (setup_server and hold): %+v", later, e.spans("web-1"))
	}
	if left := markedProcesses(scope); len(left) != 0 {
		t.Errorf("processes of autoprov runs left on the server: %v", left)
	}
	// The replica says so, with the server, the job, its attempt and the
	// runs it stopped.
	waitLogged(t, b, 10*time.Second, "job-k", "takeover stopped")
	var said bool
	for line := range strings.Lines(b.Stderr()) {
		if strings.Contains(line, "processes on the server") && strings.Contains(line, `"step":"takeover"`) {
			said = true
			for _, want := range []string{`"server":"web-1"`, `"job_id":"job-k"`, `"attempt":2`, `"earlier_runs":["` + strings.SplitN(first.marker, ".", 2)[1] + `"]`} {
				if !strings.Contains(line, want) {
					t.Errorf("takeover log line lacks %s: %s", want, line)
				}
			}
		}
	}
	if !said {
		t.Errorf("no log line of the takeover on the server")
	}
}

// A run cancelled (cancel key) in the middle of a long remote task stops
// that task on the server too, not only ansible-playbook.
func TestCancelledRunStopsItsRemoteTask(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	scope := scopeOf(t, "web-1", sshd)
	e.control("web-1", map[string]any{"hold": 300})

	a := e.infra("CANCEL_POLL=200ms")
	e.provision("job-c", "web-1", holdRequest)
	testenv.WaitFor(t, 2*time.Minute, "the long task to run on the server", func() bool {
		return len(e.holds("web-1")) == 1
	})
	if err := e.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindProvision, "job-c"), "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.waitProvision("job-c", 3*time.Minute)
	if r.Status != messages.StatusCancelled {
		t.Fatalf("result %s %+v, want cancelled", r.Status, r.Error)
	}
	// The task's own record of its stop is written by its TERM trap, which
	// may still be running when the result is out on a loaded machine.
	var hs []hold
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if hs = e.holds("web-1"); len(hs) == 1 && hs[0].released == "term" || time.Now().After(deadline) {
			break
		}
	}
	if len(hs) != 1 || hs[0].released != "term" {
		t.Fatalf("the long task on the server = %+v, want it stopped (term) with the run", hs)
	}
	if left := markedProcesses(scope); len(left) != 0 {
		t.Errorf("processes of the cancelled run left on the server: %v", left)
	}
	waitLogged(t, a, 10*time.Second, "job-c", "cleanup stopped")
}

// With one handler slot (CONCURRENCY=1), requests for a busy server do not
// hold it while they wait: a request for another, idle server published
// after them runs to its result while the busy server is still held, and
// the waiting ones run once it is free, one at a time.
func TestBusyServerRequestsDoNotHoldTheSlot(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.addServer("web-2", sshd)
	free := e.busyServer("web-1")

	p := e.infra("STREAM_CONCURRENCY=1", "SERVER_BUSY_RECHECK=200ms")
	busy := []string{"job-b1", "job-b2", "job-b3"}
	for _, id := range busy {
		e.provision(id, "web-1")
	}
	for _, id := range busy {
		waitLogged(t, p, time.Minute, id, waitingLine)
	}
	e.provision("job-idle", "web-2")
	if r := e.waitProvision("job-idle", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("job-idle: %s %+v", r.Status, r.Error)
	}
	// It finished while web-1 was still held: nothing ran there.
	for _, id := range busy {
		if rs := e.provisionResults(id); len(rs) != 0 {
			t.Fatalf("%s has a result while its server is busy: %+v", id, rs[0])
		}
	}
	if spans := e.spans("web-1"); len(spans) != 0 {
		t.Fatalf("a run started on the busy server: %+v", spans)
	}

	free()
	// They run one at a time in no set order (fair waiting is issue 33's):
	// the last may start after the two others' plays, which took 45 s
	// each on a loaded CI machine.
	for _, id := range busy {
		if r := e.waitProvision(id, 5*time.Minute); r.Status != messages.StatusSucceeded {
			t.Errorf("%s: %s %+v", id, r.Status, r.Error)
		}
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	for _, id := range append(busy, "job-idle") {
		if n := len(e.provisionResults(id)); n != 1 {
			t.Errorf("%s: %d results, want 1", id, n)
		}
	}
	spans := e.spans("web-1")
	if len(spans) != len(busy) {
		t.Errorf("runs on web-1 = %+v, want %d", spans, len(busy))
	}
	assertNoOverlap(t, spans)
	if dead := e.results(messages.StreamProvisionerQueue + ":dead"); len(dead) != 0 {
		t.Errorf("%d dead letters, want none (waiting must not count deliveries)", len(dead))
	}
}

// A run that frees its server hands its slot to the request first in the
// server's line: the waiting request starts when the run ends, not when
// its recheck (far longer here than the run) comes.
func TestFreedServerGoesToTheFirstInLine(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"sleep": 6})
	// A recheck of at most a quarter of the lease can be handed over, and
	// it must come well within store.WaitStale (15 s; a waiter not seen for
	// that long has left its line, and is handed nothing): at 15 s, a play
	// that ended just after it left job-2 stale until its recheck was
	// claimed again; at 60 s, a 21 s play on a loaded machine did. Every
	// 5 s, job-2 is fresh whenever job-1 ends, and its recheck (a few ms
	// of each 5 s) seldom runs at that very moment.
	p := e.infra("STREAM_CONCURRENCY=2", "STREAM_LEASE=60s", "SERVER_BUSY_RECHECK=5s")
	e.provision("job-1", "web-1")
	waitLogged(t, p, time.Minute, "job-1", "starting playbook")
	entry := e.provision("job-2", "web-1")
	waitLogged(t, p, time.Minute, "job-2", waitingLine)
	for _, id := range []string{"job-1", "job-2"} {
		if r := e.waitProvision(id, 3*time.Minute); r.Status != messages.StatusSucceeded {
			t.Fatalf("%s: %s %+v", id, r.Status, r.Error)
		}
	}
	handed := false
	for line := range strings.Lines(p.Stderr()) {
		if strings.Contains(line, `"msg_id":"`+entry+`"`) && strings.Contains(line, "handed the slot") {
			handed = true
		}
	}
	if !handed {
		t.Errorf("job-2's entry %s was not handed job-1's slot", entry)
	}
	spans := e.spans("web-1")
	if len(spans) != 2 {
		t.Errorf("runs on web-1 = %+v, want 2", spans)
	}
	assertNoOverlap(t, spans)
}

// After a play that succeeded, the next run of the server skips the
// takeover (the clean mark in Postgres); after a failed one it takes over
// again. The killed-controller test above covers a run that dies after
// taking the mark.
func TestTakeoverSkippedAfterSuccess(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	scope := scopeOf(t, "web-1", sshd)
	p := e.infra()
	marked := func() bool {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM clean_scopes WHERE scope = $1`, scope).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if marked() {
		t.Fatal("a clean mark before any run")
	}
	// Ansible expands the remote tmp dir's "~" as "~root" (the login
	// user's passwd home), not the session's HOME: here, this machine's.
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	remoteHome := u.HomeDir
	t.Cleanup(func() { os.RemoveAll(filepath.Join(remoteHome, ".ansible", "tmp", "autoprov-"+scope)) })
	steps := []struct {
		job      string
		fail     bool
		takeover string // what the run's takeover did
		mark     bool   // the mark after the run
	}{
		{"job-1", false, "takeover stopped", true}, // nothing known: takes over
		{"job-2", false, "takeover skipped", true}, // after a success
		{"job-3", true, "takeover skipped", false}, // after a success; fails
		{"job-4", false, "takeover stopped", true}, // after a failure
	}
	for _, s := range steps {
		e.control("web-1", map[string]any{"fail": s.fail})
		e.provision(s.job, "web-1")
		r := e.waitProvision(s.job, 2*time.Minute)
		if want := map[bool]messages.Status{false: messages.StatusSucceeded, true: messages.StatusFailed}[s.fail]; r.Status != want {
			t.Fatalf("%s: %s %+v, want %s", s.job, r.Status, r.Error, want)
		}
		waitLogged(t, p, 10*time.Second, s.job, s.takeover)
		other := map[string]string{"takeover stopped": "takeover skipped", "takeover skipped": "takeover stopped"}[s.takeover]
		for line := range strings.Lines(p.Stderr()) {
			if strings.Contains(line, `"job_id":"`+s.job+`"`) && strings.Contains(line, other) {
				t.Errorf("%s: want %q only, logged: %s", s.job, s.takeover, line)
			}
		}
		if got := marked(); got != s.mark {
			t.Errorf("%s: clean mark %v, want %v", s.job, got, s.mark)
		}
		// The runs of a server share one remote tmp dir (its copy tasks
		// use it): runs that skip the takeover do not leave one each.
		left, err := filepath.Glob(filepath.Join(remoteHome, ".ansible", "tmp", "autoprov-"+scope+"*"))
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(remoteHome, ".ansible", "tmp", "autoprov-"+scope); len(left) != 1 || left[0] != want {
			t.Errorf("%s: remote tmp dirs of the server %v, want only %s", s.job, left, want)
		}
	}
}
