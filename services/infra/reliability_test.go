package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
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
	pg := testenv.StartPostgresServer(t)
	e := newE2E(t, sshd)
	e.dsn = pg.URL()
	pool, err := store.Open(context.Background(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool = pool
	return e, pg
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
