package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// The three ports of package jobs, faked the way benbjohnson/wtf's mock
// package does it: a function field per method, set by each test, and the
// calls recorded.

var (
	_ jobs.Runner     = (*fakeRunner)(nil)
	_ jobs.SSHChecker = (*fakeSSH)(nil)
	_ jobs.Provider   = (*fakeProvider)(nil)
)

// fakeRunner is a jobs.Runner.
type fakeRunner struct {
	RunFn        func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error)
	ForgetHostFn func(alias string)

	mu      sync.Mutex
	specs   []ansible.Spec
	forgot  []string
	closed  []string      // CloseWarm
	started chan struct{} // closed when the first Run is called
	once    sync.Once
}

func newFakeRunner(run func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error)) *fakeRunner {
	return &fakeRunner{RunFn: run, started: make(chan struct{})}
}

func (r *fakeRunner) Run(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	r.once.Do(func() { close(r.started) })
	return r.RunFn(ctx, spec)
}

func (r *fakeRunner) ForgetHost(alias string) {
	r.mu.Lock()
	r.forgot = append(r.forgot, alias)
	r.mu.Unlock()
	if r.ForgetHostFn != nil {
		r.ForgetHostFn(alias)
	}
}

func (r *fakeRunner) CloseWarm(alias string) {
	r.mu.Lock()
	r.closed = append(r.closed, alias)
	r.mu.Unlock()
}

// warmClosed returns the hosts whose warm connections were closed.
func (r *fakeRunner) warmClosed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.closed...)
}

// calls returns the specs of the runs so far.
func (r *fakeRunner) calls() []ansible.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ansible.Spec(nil), r.specs...)
}

// forgotten returns the hosts whose facts were dropped.
func (r *fakeRunner) forgotten() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.forgot...)
}

// fakeSSH is a jobs.SSHChecker.
type fakeSSH struct {
	CheckFn func(ctx context.Context, t sshcheck.Target, signers []ssh.Signer) (*sshcheck.Result, error)

	n       atomic.Int32
	mu      sync.Mutex
	targets []sshcheck.Target
	started chan struct{} // closed when the first check is made
	once    sync.Once
}

func newFakeSSH(check func(ctx context.Context, t sshcheck.Target, signers []ssh.Signer) (*sshcheck.Result, error)) *fakeSSH {
	return &fakeSSH{CheckFn: check, started: make(chan struct{})}
}

func (s *fakeSSH) Check(ctx context.Context, t sshcheck.Target, signers []ssh.Signer) (*sshcheck.Result, error) {
	s.n.Add(1)
	s.once.Do(func() { close(s.started) })
	s.mu.Lock()
	s.targets = append(s.targets, t)
	s.mu.Unlock()
	return s.CheckFn(ctx, t, signers)
}

func (s *fakeSSH) calls() int { return int(s.n.Load()) }

// fakeProvider is a jobs.Provider.
type fakeProvider struct {
	ServerFn    func(ctx context.Context, serverID int64) (*time4vps.Server, error)
	ReinstallFn func(ctx context.Context, serverID int64, req time4vps.ReinstallRequest) (int64, error)
	WaitTaskFn  func(ctx context.Context, serverID, taskID int64) (*time4vps.Task, error)

	reinstalls atomic.Int32
}

func (p *fakeProvider) Server(ctx context.Context, serverID int64) (*time4vps.Server, error) {
	return p.ServerFn(ctx, serverID)
}

func (p *fakeProvider) Reinstall(ctx context.Context, serverID int64, req time4vps.ReinstallRequest) (int64, error) {
	p.reinstalls.Add(1)
	return p.ReinstallFn(ctx, serverID, req)
}

func (p *fakeProvider) WaitTask(ctx context.Context, serverID, taskID int64) (*time4vps.Task, error) {
	return p.WaitTaskFn(ctx, serverID, taskID)
}

// newFakeClock is a clock whose time a test moves by hand.
func newFakeClock() *clocktest.Fake {
	return clocktest.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// Behaviours of the fakes.

// passes is an SSH check that passes, the server presenting hostKey.
func passes(hostKey string) func(context.Context, sshcheck.Target, []ssh.Signer) (*sshcheck.Result, error) {
	return func(_ context.Context, t sshcheck.Target, _ []ssh.Signer) (*sshcheck.Result, error) {
		return &sshcheck.Result{HostKey: hostKey, FirstUse: t.PinnedKey == ""}, nil
	}
}

// fails is an SSH check that fails with err.
func fails(err error) func(context.Context, sshcheck.Target, []ssh.Signer) (*sshcheck.Result, error) {
	return func(context.Context, sshcheck.Target, []ssh.Signer) (*sshcheck.Result, error) {
		return &sshcheck.Result{}, err
	}
}

// plays is a run that reports the run's start and two events and ends with
// outcome.
func plays(outcome ansible.Outcome) func(context.Context, ansible.Spec) (*ansible.Result, error) {
	return func(_ context.Context, spec ansible.Spec) (*ansible.Result, error) {
		if spec.OnStart != nil {
			spec.OnStart(4242)
		}
		if spec.OnEvent != nil {
			spec.OnEvent(ansible.Event{Seq: 1, Type: ansible.EventPlayStart, Play: "Play", Time: time.Now()})
			spec.OnEvent(ansible.Event{Seq: 2, Type: ansible.EventTaskStart, Play: "Play", Task: "Task", Time: time.Now()})
		}
		return playResult(outcome, spec.Host.Alias), nil
	}
}

// playResult is what a run ending with outcome on host returns.
func playResult(outcome ansible.Outcome, host string) *ansible.Result {
	now := time.Now()
	r := &ansible.Result{
		Outcome:    outcome,
		Hosts:      map[string]ansible.Recap{host: {OK: 3, Changed: 1}},
		OutputTail: "PLAY RECAP\n" + host + " : ok=3 changed=1\n",
		StartedAt:  now.Add(-time.Second),
		ExitedAt:   now.Add(-time.Millisecond),
		FinishedAt: now,
	}
	switch outcome {
	case ansible.OutcomeSucceeded:
	case ansible.OutcomeFailed:
		r.ExitCode = 2
		r.Hosts[host] = ansible.Recap{OK: 1, Failed: 1}
		r.FailedTask = &ansible.FailedTask{Name: "Planned failure", Host: host, Play: "Play", Message: "boom"}
		r.Err = fmt.Errorf("failed on %s in task %q: boom", host, "Planned failure")
	case ansible.OutcomeUnreachable:
		r.ExitCode = 4
		r.Hosts[host] = ansible.Recap{Unreachable: 1}
		r.FailedTask = &ansible.FailedTask{Name: "Gathering Facts", Host: host, Play: "Play", Message: "ssh: connect: Connection refused"}
		r.Err = fmt.Errorf("host %s unreachable", host)
	default:
		r.ExitCode = 143
		r.Err = fmt.Errorf("run ended %s", outcome)
	}
	return r
}

// hangs is an SSH check that hangs until its context ends.
func hangs() func(context.Context, sshcheck.Target, []ssh.Signer) (*sshcheck.Result, error) {
	return func(ctx context.Context, t sshcheck.Target, _ []ssh.Signer) (*sshcheck.Result, error) {
		<-ctx.Done()
		return &sshcheck.Result{}, fmt.Errorf("ssh check %s canceled: %w", t.Address, ctx.Err())
	}
}

// blocks is a run that starts and runs until its context ends, then
// reports itself cancelled, as the runner does.
func blocks() func(context.Context, ansible.Spec) (*ansible.Result, error) {
	return func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
		if spec.OnStart != nil {
			spec.OnStart(4242)
		}
		<-ctx.Done()
		r := playResult(ansible.OutcomeCancelled, spec.Host.Alias)
		r.FailedTask = &ansible.FailedTask{Name: "Sleep", Host: spec.Host.Alias, Play: "Play", Message: "cancelled"}
		r.Err = fmt.Errorf("cancelled: %w", context.Cause(ctx))
		return r, nil
	}
}
