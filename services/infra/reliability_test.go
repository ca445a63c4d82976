package main

import (
	"context"
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
	if !strings.Contains(a.Stderr(), "releasing entry to other consumers") {
		t.Errorf("the entry was not released at shutdown")
	}

	a2 := e.infra(name)
	waitLogged(t, a2, time.Minute, "job-t", waitingLine)
	free()
	assertOneSuccess(t, e, "job-t")
}
