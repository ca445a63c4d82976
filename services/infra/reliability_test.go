package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// busyServer holds the server lock of handle as another run would, until
// the returned func is called.
func (e *e2e) busyServer(handle string) (free func()) {
	e.t.Helper()
	ctx := context.Background()
	l, err := store.AcquireRunLocks(ctx, e.pool, "busy-"+handle, "server:"+handle, store.LockOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	freed := false
	free = func() {
		if !freed {
			freed = true
			_ = l.Release(ctx)
		}
	}
	e.t.Cleanup(free)
	return free
}

const waitingLine = "waiting for another run on this server to finish"

// waitLogged waits until p's log has a line of the job containing text.
func waitLogged(t *testing.T, p *infraProc, timeout time.Duration, jobID, text string) {
	t.Helper()
	testenv.WaitFor(t, timeout, jobID+": "+text, func() bool {
		for line := range strings.Lines(p.Stderr()) {
			if strings.Contains(line, `"job_id":"`+jobID+`"`) && strings.Contains(line, text) {
				return true
			}
		}
		return false
	})
}

// assertOneSuccess checks that the job got exactly one result, succeeded,
// and that every request entry was acknowledged.
func assertOneSuccess(t *testing.T, e *e2e, jobID string) {
	t.Helper()
	if r := e.waitProvision(jobID, 2*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("%s: %s %+v", jobID, r.Status, r.Error)
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	if n := len(e.provisionResults(jobID)); n != 1 {
		t.Errorf("%d results, want exactly 1", n)
	}
	spans := e.spans("web-1")
	if len(spans) != 1 || spans[0].end == 0 {
		t.Errorf("runs = %+v, want one complete run", spans)
	}
}

// A replica killed with -9 while its job waits for a busy server loses
// nothing: its Postgres backend, blocked in the lock wait, gives up the job
// lock within a lock_timeout slice, and the replica that takes the request
// over neither acknowledges nor drops it while that lock is held: it runs
// the job once the server is free.
func TestKilledWhileWaitingForBusyServerLosesNothing(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	free := e.busyServer("web-1")

	a := e.infra()
	e.provision("job-w", "web-1")
	waitLogged(t, a, time.Minute, "job-w", waitingLine)
	a.Signal(syscall.SIGKILL)
	a.Wait(10 * time.Second)

	b := e.infra()
	// b takes the request over (after the lease) and waits for the server
	// itself: the request was neither dropped nor acknowledged.
	waitLogged(t, b, time.Minute, "job-w", waitingLine)
	if spans := e.spans("web-1"); len(spans) != 0 {
		t.Fatalf("a run started on a busy server: %+v", spans)
	}
	free()
	assertOneSuccess(t, e, "job-w")
}

// A SIGTERM of a replica whose job waits for a busy server stops it within
// SHUTDOWN_GRACE with status 0, its entry released: the consumer's drain
// grace leaves room for cancelling the wait. Restarted under the same name,
// it runs the job once the server is free.
func TestSIGTERMWhileWaitingForBusyServerReleasesTheRequest(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	free := e.busyServer("web-1")

	name := "STREAM_CONSUMER_NAME=" + testenv.Unique("infra-a-")
	a := e.infra(name)
	e.provision("job-t", "web-1")
	waitLogged(t, a, time.Minute, "job-t", waitingLine)
	a.Signal(syscall.SIGTERM)
	if code := a.Wait(time.Minute); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0; logs:\n%s", code, a.Stderr())
	}
	// The entry was released, not acknowledged: at shutdown when a
	// handler had it, else before, when it left its slot to wait for the
	// busy server (stream.Later).
	if !strings.Contains(a.Stderr(), "releasing entry to other consumers") && !strings.Contains(a.Stderr(), "it will be delivered again") {
		t.Errorf("the entry was neither released at shutdown nor left pending to wait")
	}

	a2 := e.infra(name)
	waitLogged(t, a2, time.Minute, "job-t", waitingLine)
	free()
	assertOneSuccess(t, e, "job-t")
}

// newE2EOwnPostgres is newE2E on a Postgres server of the test's own, which
// it may stop and start.
func newE2EOwnPostgres(t *testing.T, sshd *testenv.SSHD) (*e2e, *testenv.PostgresServer) {
	t.Helper()
	e := newE2E(t, sshd)
	return e, e.ownPostgres()
}

// ownPostgres moves e, before any infra starts, onto a Postgres server of
// the test's own, which it may stop and start, and returns that server.
func (e *e2e) ownPostgres() *testenv.PostgresServer {
	e.t.Helper()
	pg := testenv.StartPostgresServer(e.t)
	e.dsn = pg.URL()
	pool, err := store.Open(context.Background(), e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	e.pool = pool
	return pg
}

// A Postgres outage in the middle of a job (a restart: every session
// ended, nothing answers for a while) does not fail it: the job waits the
// outage out (DB_OUTAGE_WAIT), runs again if its run was cut off, and
// publishes exactly one result, the stored one; nothing is dead-lettered
// and nothing is left in a transient state.
func TestPostgresOutageDuringJobDoesNotFailIt(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e, pg := newE2EOwnPostgres(t, sshd)

	e.infra("DB_OUTAGE_WAIT=2m", "STREAM_MAX_DELIVERIES=3") // migrates the database
	e.addServer("web-1", sshd)
	e.control("web-1", map[string]any{"sleep": 3})
	e.provision("job-o", "web-1")
	testenv.WaitFor(t, 3*time.Minute, "the run to start on the server", func() bool { return len(e.spans("web-1")) == 1 })

	// The outage outlasts the play: its end, the result's storing and the
	// retries of the request all fall into it.
	pg.Stop()
	time.Sleep(8 * time.Second)
	pg.Start()

	r := e.waitProvision("job-o", 3*time.Minute)
	if r.Status != messages.StatusSucceeded {
		t.Fatalf("result = %s %+v, want succeeded", r.Status, r.Error)
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	if n := len(e.provisionResults("job-o")); n != 1 {
		t.Errorf("%d results, want exactly 1", n)
	}
	if dead := e.results(messages.StreamProvisionerQueue + ":dead"); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	if run := e.run("job-o"); run.State != store.RunDone || run.Status != "succeeded" {
		t.Errorf("run = %+v, want done and succeeded", run)
	}
	if s := e.server("web-1"); s.Status != store.ServerReady {
		t.Errorf("server = %s, want %s", s.Status, store.ServerReady)
	}
	spans := e.spans("web-1")
	if len(spans) == 0 || spans[len(spans)-1].end == 0 {
		t.Errorf("runs = %+v, want the last one complete", spans)
	}
	assertNoOverlap(t, spans)
}

// A Postgres outage of 20 s while 20 plays run (a restart: every lock
// session ended) stops none of them: each keeps its server's lock through
// its lease (RUN_LOCK_LEASE), takes it again when Postgres is back, and
// finishes; no play runs twice, every job has exactly one result, from its
// first attempt.
func TestPostgresOutageStopsNoRunningPlay(t *testing.T) {
	t.Parallel()
	const n = 20
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e, pg := newE2EOwnPostgres(t, sshd)

	e.infra("STREAM_CONCURRENCY="+strconv.Itoa(n), "DB_OUTAGE_WAIT=3m", "RUN_LOCK_LEASE=60s") // migrates the database
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("web-%02d", i)
		e.addServer(hosts[i], sshd)
		e.control(hosts[i], map[string]any{"sleep": 30})
		e.provision("job-"+hosts[i], hosts[i])
	}
	testenv.WaitFor(t, 3*time.Minute, "every play to start", func() bool {
		for _, h := range hosts {
			if len(e.spans(h)) == 0 {
				return false
			}
		}
		return true
	})

	pg.Stop()
	time.Sleep(20 * time.Second)
	pg.Start()

	for _, h := range hosts {
		r := e.waitProvision("job-"+h, 3*time.Minute)
		if r.Status != messages.StatusSucceeded {
			t.Errorf("%s: result = %s %+v, want succeeded", h, r.Status, r.Error)
		}
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	for _, h := range hosts {
		if n := len(e.provisionResults("job-" + h)); n != 1 {
			t.Errorf("%s: %d results, want exactly 1", h, n)
		}
		if spans := e.spans(h); len(spans) != 1 || spans[0].end == 0 {
			t.Errorf("%s: plays = %+v, want one, finished (none stopped, none run twice)", h, spans)
		}
		if run := e.run("job-" + h); run.State != store.RunDone || run.Attempt != 1 {
			t.Errorf("%s: run = state %s attempt %d, want done at its first attempt", h, run.State, run.Attempt)
		}
	}
	if dead := e.results(messages.StreamProvisionerQueue + ":dead"); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}

// outagePlay holds its host for hold seconds and then until the test's
// marker outage-over exists, so that the whole outage falls within every
// play however long the plays took to start; it records its start and end
// per host in spans.log, as slowPlay does.
const outagePlay = `- name: Through the outage
  hosts: all
  gather_facts: false
  tasks:
    - name: Hold the host through the outage
      ansible.builtin.shell: >-
        echo "start job {{ inventory_hostname }} $(date +%s.%N)" >> {{ out }}/spans.log;
        sleep {{ hold }};
        for i in $(seq 600); do [ -e {{ out }}/outage-over ] && break; sleep 0.5; done;
        echo "end job {{ inventory_hostname }} $(date +%s.%N)" >> {{ out }}/spans.log
      changed_when: true
`

// jobSpans returns the plays on each host of spans.log (slowPlay's and
// outagePlay's records): a start opens one, the next end on its host
// closes it (end 0: it never finished).
func (w *jobWorld) jobSpans() map[string][]span {
	w.t.Helper()
	out := map[string][]span{}
	path := filepath.Join(w.out, "spans.log")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return out
	}
	// "<start|end> job <host> <unix time>"
	for _, fs := range w.recordsIn(path) {
		ts, _ := strconv.ParseFloat(fs[3], 64)
		host := fs[2]
		ss := out[host]
		switch {
		case fs[0] == "start":
			out[host] = append(ss, span{token: host, playbook: fs[1], start: ts})
		case fs[0] == "end" && len(ss) > 0 && ss[len(ss)-1].end == 0:
			ss[len(ss)-1].end = ts
		default:
			w.t.Errorf("%s on %s with no play running there", fs[0], host)
		}
	}
	return out
}

// The twin of TestPostgresOutageStopsNoRunningPlay for Ansible jobs: a
// Postgres outage of 20 s while 20 jobs run their plays (some over two
// hosts: a job holds one lock per host, each with its lease) stops none of
// them: each keeps its hosts' locks through their leases (RUN_LOCK_LEASE),
// takes them again when Postgres is back, and finishes; no play runs
// twice, every job has exactly one result, from its first attempt.
func TestPostgresOutageStopsNoRunningJobPlay(t *testing.T) {
	t.Parallel()
	const (
		n     = 20 // jobs
		pairs = 4  // of them over two hosts each
	)
	w := newJobWorld(t, n+pairs)
	pg := w.ownPostgres()
	w.repo.Commit(t, map[string]string{"outage.yml": outagePlay})
	w.start("STREAM_CONCURRENCY="+strconv.Itoa(n), "DB_OUTAGE_WAIT=3m", "RUN_LOCK_LEASE=60s") // migrates the database

	jobHosts := map[string][]string{} // job id: its hosts
	next := 0
	for i := range n {
		id := fmt.Sprintf("job-outage-%02d", i)
		hosts := map[string]messages.Vars{}
		size := 1
		if i >= n-pairs {
			size = 2 // the last jobs, over two hosts each
		}
		for range size {
			name := fmt.Sprintf("h%02d", next)
			hosts[name] = w.host(next)
			jobHosts[id] = append(jobHosts[id], name)
			next++
		}
		m := w.job(id, hosts, "outage.yml")
		m.Options.ExtraVars["hold"] = int64(30)
		w.submit(m)
	}
	if next != n+pairs {
		t.Fatalf("%d hosts used, want %d", next, n+pairs)
	}
	testenv.WaitFor(t, 3*time.Minute, "every play to start on every host", func() bool {
		return len(w.jobSpans()) == n+pairs
	})

	stopped := float64(time.Now().UnixNano()) / 1e9
	pg.Stop()
	time.Sleep(20 * time.Second)
	pg.Start()
	restarted := float64(time.Now().UnixNano()) / 1e9
	if err := os.WriteFile(filepath.Join(w.out, "outage-over"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	for id := range jobHosts {
		jobStatus(t, w.waitJob(id, 3*time.Minute), messages.StatusSucceeded, "")
	}
	w.waitAcked(messages.StreamAnsibleJobQueue, time.Minute)
	spans := w.jobSpans()
	for id, hosts := range jobHosts {
		if n := len(w.jobResults(id)); n != 1 {
			t.Errorf("%s: %d results, want exactly 1", id, n)
		}
		for _, h := range hosts {
			ss := spans[h]
			if len(ss) != 1 || ss[0].end == 0 {
				t.Errorf("%s on %s: plays = %+v, want one, finished (none stopped, none run twice)", id, h, ss)
				continue
			}
			assertNoOverlap(t, ss)
			if ss[0].start > stopped || ss[0].end < restarted {
				t.Errorf("%s on %s: play [%.3f, %.3f] does not span the outage [%.3f, %.3f]", id, h, ss[0].start, ss[0].end, stopped, restarted)
			}
		}
		if run := w.run(id); run.State != store.RunDone || run.Attempt != 1 {
			t.Errorf("%s: run = state %s attempt %d, want done at its first attempt", id, run.State, run.Attempt)
		}
	}
	if dead := w.results(messages.StreamAnsibleJobQueue + stream.DeadLetterSuffix); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}
