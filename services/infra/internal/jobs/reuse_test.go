package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// reuseRig runs recovery requests (they leave the SSH user as it is) for
// one server through a handler whose passed SSH checks stand for window,
// on a clock the test moves.
type reuseRig struct {
	t      *testing.T
	w      *world
	f      *fakes
	h      *jobs.Handler
	handle string
	n      int
}

func newReuseRig(t *testing.T, w *world, handle string, window time.Duration) *reuseRig {
	w.addServer(t, handle)
	f := w.newFakes()
	f.clock = newFakeClock()
	h := w.handler(t, f, func(c *jobs.Config) { c.SSHCheckReuse = window })
	return &reuseRig{t: t, w: w, f: f, h: h, handle: handle}
}

// run handles one more recovery request and returns its result.
func (r *reuseRig) run() *messages.ProvisionerResult {
	r.t.Helper()
	r.n++
	jobID := fmt.Sprintf("%s-job-%d", r.handle, r.n)
	msg := r.w.provision(r.t, jobID, r.handle, 1, func(m *messages.ProvisionerMessage) { m.IsRecovery = true })
	if err := handle(r.t, r.h, nil, msg, nil); err != nil {
		r.t.Fatalf("%s: %v", jobID, err)
	}
	rs := r.w.provisionResults(r.t, jobID)
	if len(rs) != 1 {
		r.t.Fatalf("%s: %d results", jobID, len(rs))
	}
	return rs[0]
}

// wantChecks fails unless n SSH checks were made so far.
func (r *reuseRig) wantChecks(n int, when string) {
	r.t.Helper()
	if got := r.f.ssh.calls(); got != n {
		r.t.Errorf("%s: %d SSH checks so far, want %d", when, got, n)
	}
}

func TestSSHCheckReuse(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const window = 5 * time.Second

	t.Run("within the window", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-1", window)
		r.run()
		r.wantChecks(1, "first run")
		r.f.clock.Advance(4 * time.Second)
		if res := r.run(); res.Status != messages.StatusSucceeded {
			t.Fatalf("second run: %s %+v", res.Status, res.Error)
		}
		r.wantChecks(1, "4s later")
		if n := metricValue(t, r.f, "autoprov_infra_ssh_checks_reused_total"); n != 1 {
			t.Errorf("reuse counter %v, want 1", n)
		}
		specs := r.f.runner.calls()
		if len(specs) != 2 || specs[1].Host.KnownHostsKey != w.hostKey {
			t.Fatalf("the reused run did not get the pinned key: %+v", specs)
		}
		// The play that succeeded counts as a check passed when it ended.
		r.f.clock.Advance(4 * time.Second) // 8s after the check, 4s after the play
		r.run()
		r.wantChecks(1, "4s after a play that succeeded")
		r.f.clock.Advance(6 * time.Second)
		r.run()
		r.wantChecks(2, "past the window")
	})

	t.Run("window 0 checks every run", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-2", 0)
		r.run()
		r.run()
		r.wantChecks(2, "two runs")
	})

	t.Run("changed pin, user or key", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-3", window)
		r.run()
		ctx := context.Background()
		steps := []struct{ what, set string }{
			{"another pinned host key", "host_key = '" + w.otherHostKey + "'"},
			{"another user", "ssh_user = 'admin'"},
			{"another SSH key", "ssh_key_ref = 'env:AUTOPROV_SECRET_SSH_KEY_2'"},
		}
		// The check presents whatever is pinned now.
		r.f.ssh.CheckFn = func(_ context.Context, tg sshcheck.Target, _ []ssh.Signer) (*sshcheck.Result, error) {
			return &sshcheck.Result{HostKey: tg.PinnedKey}, nil
		}
		for i, s := range steps {
			if _, err := w.pool.Exec(ctx, `UPDATE servers SET `+s.set+` WHERE handle = $1`, r.handle); err != nil {
				t.Fatal(err)
			}
			if res := r.run(); res.Status != messages.StatusSucceeded {
				t.Fatalf("%s: %s %+v", s.what, res.Status, res.Error)
			}
			r.wantChecks(i+2, s.what)
		}
		r.run()
		r.wantChecks(len(steps)+1, "nothing changed")
	})

	t.Run("a failed check is never followed by a reuse", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-6", window)
		r.run() // passes, pinning w.hostKey
		ctx := context.Background()
		repin := func(key string) {
			if _, err := w.pool.Exec(ctx, `UPDATE servers SET host_key = $2 WHERE handle = $1`, r.handle, key); err != nil {
				t.Fatal(err)
			}
		}
		// Pinned to another key, the check runs and fails...
		repin(w.otherHostKey)
		r.f.ssh.CheckFn = fails(&sshcheck.HostKeyMismatchError{Address: "192.0.2.10", Port: 22, Expected: w.otherHostKey, Got: w.hostKey})
		if res := r.run(); res.Status != messages.StatusFailed {
			t.Fatalf("mismatch run: %s", res.Status)
		}
		// ...and back on the key that passed a moment ago, it runs again.
		repin(w.hostKey)
		r.f.ssh.CheckFn = passes(w.hostKey)
		r.run()
		r.wantChecks(3, "after a failed check")
	})

	t.Run("a play that finds the server down checks, and so does the next run", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-4", window)
		r.run()
		down := &sshcheck.UnreachableError{Address: "192.0.2.10", Port: 22, Attempts: 3, Class: sshcheck.ClassRefused, Err: errors.New("refused")}
		r.f.ssh.CheckFn = fails(down)
		r.f.runner.RunFn = plays(ansible.OutcomeUnreachable)
		// The reused check let the play run; it found the server down, and
		// the check made then says so, as it would have before the play.
		res := r.run()
		checkResult(t, &res.Outcome, messages.StatusUnreachable, messages.KindSSHUnreachable, "did not answer SSH")
		r.wantChecks(2, "after the play found the server down")
		// Never reused after a failure, even within the window.
		r.f.runner.RunFn = plays(ansible.OutcomeSucceeded)
		if res := r.run(); res.Status != messages.StatusUnreachable {
			t.Fatalf("third run: %s", res.Status)
		}
		r.wantChecks(3, "right after the failure")
		if n := len(r.f.runner.calls()); n != 2 {
			t.Errorf("%d plays, want 2 (none after the failed check)", n)
		}
	})

	t.Run("a host key changed behind a reused check is named", func(t *testing.T) {
		t.Parallel()
		r := newReuseRig(t, w, "reuse-5", window)
		r.run()
		r.f.ssh.CheckFn = fails(&sshcheck.HostKeyMismatchError{Address: "192.0.2.10", Port: 22, Expected: w.hostKey, Got: w.otherHostKey})
		r.f.runner.RunFn = func(_ context.Context, spec ansible.Spec) (*ansible.Result, error) {
			res := playResult(ansible.OutcomeUnreachable, spec.Host.Alias)
			res.FailedTask.Message = "Host key verification failed."
			return res, nil
		}
		res := r.run()
		checkResult(t, &res.Outcome, messages.StatusFailed, messages.KindHostKeyMismatch, "host key mismatch")
		if s := w.server(t, r.handle); s.HostKey != w.hostKey {
			t.Errorf("pinned key changed to %q", s.HostKey)
		}
	})
}

// metricValue returns the value of the counter named name in the fakes'
// registry (0 when it was never set).
func metricValue(t *testing.T, f *fakes, name string) float64 {
	t.Helper()
	mfs, err := f.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
