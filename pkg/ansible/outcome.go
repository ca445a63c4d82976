package ansible

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Outcome is how a run ended.
type Outcome string

// Outcomes of a run.
const (
	// OutcomeSucceeded: exit 0 and no failed or unreachable host.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeFailed: a task failed (not ignored, not rescued) on a host
	// that was reached, whether other hosts were or not.
	OutcomeFailed Outcome = "failed"
	// OutcomeUnreachable: the host (a host of a job) could not be reached
	// (or dropped), and no task failed on another one.
	OutcomeUnreachable Outcome = "unreachable"
	// OutcomeTimeout: the wall-clock limit was hit and the run was killed.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeIdleTimeout: no output for IdleTimeout; the run was killed.
	OutcomeIdleTimeout Outcome = "idle_timeout"
	// OutcomeCancelled: the context ended; the run was killed.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeError: ansible-playbook failed otherwise (syntax error,
	// crash, no usable result).
	OutcomeError Outcome = "error"
)

// Result is what a run produced.
type Result struct {
	// Outcome is how the run ended.
	Outcome Outcome
	// ExitCode is ansible-playbook's exit status (128+N when signal N
	// killed it; -1 when it never started).
	ExitCode int
	// Hosts is the play recap per host: from the stats event, or counted
	// from host events when the run died before it.
	Hosts map[string]Recap
	// FailedTask is the first failure that decided the outcome: the first
	// failed task (not ignored, not rescued), the first unreachable host
	// when no task failed, or for timeout/idle_timeout/cancelled the task
	// that was running. Nil on success.
	FailedTask *FailedTask
	// OutputTail is the end of stdout+stderr, redacted.
	OutputTail string
	// StartedAt is when ansible-playbook was started, ExitedAt when it
	// exited (as runguard saw it; unguarded, or when runguard died first:
	// when it was reaped), FinishedAt when the run was over (process group
	// gone, pipes drained, leftovers killed).
	StartedAt, ExitedAt, FinishedAt time.Time
	// Err says why when Outcome is not succeeded; it never holds a secret.
	Err error
	// RemoteRun is the run part of the marker the run's remote work
	// carries on the target (AUTOPROV_RUN, see remote.go).
	RemoteRun string
	// Takeover is what the takeover before the play found and stopped of
	// earlier runs on the target; nil when it could not connect (the play
	// then found the target unreachable).
	Takeover *RemoteReport
	// Cleanup is what the cleanup after a stopped play (cancelled,
	// timeout, idle timeout) stopped of the run's own work on the target.
	Cleanup *RemoteReport
	// Steps are how long the runner's own steps before the play took.
	Steps Steps
	// Artifacts are the run's set_stats data (per_host: false), every
	// string redacted; nil when the play set none.
	Artifacts map[string]any
}

// Steps are the runner's own time before a play, step by step: the
// infra service's per-step overhead breakdown reports them.
type Steps struct {
	// RunDir is creating the run directory and writing its inputs.
	RunDir time.Duration
	// Agent is starting the run's in-process ssh-agent.
	Agent time.Duration
	// Takeover is the SSH session that stops earlier runs' work on the
	// target. It runs while ansible-playbook starts up (gate.go).
	Takeover time.Duration
	// TakeoverWait is the part of it the play waited for: from the
	// playbook's start (its playbook_start event) to the takeover's end.
	TakeoverWait time.Duration
	// Start is from exec to ansible-playbook running (runguard's start,
	// its exec of ansible-playbook).
	Start time.Duration
	// Play is ansible-playbook running, from its start to its exit, less
	// its wait at the gate for the takeover.
	Play time.Duration
}

// result collects the finished run's Result.
func (e *execution) result() *Result {
	code := exitCode(e.state)
	ev := &e.events
	res := &Result{
		ExitCode:   code,
		Hosts:      ev.hosts(),
		OutputTail: e.tail.String(),
		StartedAt:  e.started,
		ExitedAt:   e.exitedAt(),
		FinishedAt: time.Now(),
		Artifacts:  ev.custom,
	}
	if res.Hosts == nil {
		res.Hosts = map[string]Recap{}
	}
	v := verdict{stop: e.stopReason, stopErr: e.stopErr, code: code, ev: ev,
		lastTask: e.lastTask.Load(), alias: e.spec.Host.Alias, summary: e.tail.summary()}
	res.Outcome, res.FailedTask, res.Err = v.classify()
	if res.Err != nil {
		res.Err = errors.New(e.spec.Redact(res.Err.Error()))
	}
	if res.FailedTask != nil {
		ft := *res.FailedTask
		ft.Message = e.spec.Redact(ft.Message)
		res.FailedTask = &ft
	}
	if ev.malformed > 0 {
		e.log.Warn().Int("lines", ev.malformed).Msg("skipped malformed event lines")
	}
	if v.mismatch != "" {
		e.log.Warn().Int("exit_code", code).Msg(v.mismatch)
	}
	ll := e.log.Info()
	if res.Err != nil {
		ll = e.log.Warn().Str("error", res.Err.Error())
	}
	ll.Str("outcome", string(res.Outcome)).Int("exit_code", code).Int("events", ev.count).
		Dur("duration", res.FinishedAt.Sub(res.StartedAt)).Msg("ansible-playbook finished")
	return res
}

// exitCode is the exit status, 128+N when signal N killed the process.
func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// verdict holds what decides a run's outcome.
type verdict struct {
	stop     Outcome // set when the runner stopped the run
	stopErr  error
	code     int // exit status
	ev       *eventState
	lastTask *FailedTask // the task running last
	alias    string
	summary  string // the output line that best explains a failure
	mismatch string // set by classify when events and exit code disagree
}

// classify applies the outcome rules: the runner's own stop reason first;
// then the events (the stats event when there is one, else the host
// events): a task that failed on a host that was reached before unreachable
// hosts, and a host's own unreachability before its failures; the exit code
// (0 ok, 2 failed hosts, 4 unreachable hosts, also with failed ones, or a
// parse error, others errors) decides only what the events leave open.
func (v *verdict) classify() (Outcome, *FailedTask, error) {
	ev := v.ev
	var anyFailed bool
	unreachable := 0
	for _, h := range ev.hosts() {
		anyFailed = anyFailed || (h.Failed > 0 && h.Unreachable == 0)
		if h.Unreachable > 0 {
			unreachable++
		}
	}
	failed, unreached := ev.firstFailure(), ev.firstUnreachable()
	// name is the host of a failure: the event's, else the run's ("" for
	// a job's, which has no one host); hostOf and onHost phrase it.
	name := func(ft *FailedTask) string {
		switch {
		case ft != nil && ft.Host != "":
			return ft.Host
		case v.alias == jobHostAlias:
			return ""
		}
		return v.alias
	}
	hostOf := func(ft *FailedTask) string {
		if n := name(ft); n != "" {
			return "host " + n
		}
		return "a host of the job"
	}
	onHost := func(ft *FailedTask) string { return cmp.Or(name(ft), "a host of the job") }
	describe := func(ft *FailedTask) string {
		if ft == nil {
			return ""
		}
		s := ""
		if ft.Name != "" {
			s = fmt.Sprintf(" in task %q", ft.Name)
		}
		if ft.Message != "" {
			s += ": " + ft.Message
		}
		return s
	}
	switch {
	case v.stop != "":
		var ft *FailedTask
		if v.lastTask != nil && v.stop != OutcomeError {
			t := *v.lastTask
			t.Host = name(&t) // the run's; none for a job's, which runs on several hosts
			t.Message = v.stopErr.Error()
			ft = &t
		}
		return v.stop, ft, v.stopErr
	case anyFailed:
		// Other hosts unreachable too: ansible-playbook exits 4.
		if v.code != 2 && (unreachable == 0 || v.code != 4) {
			v.mismatch = "events show a failed task but the exit code is not 2"
		}
		also := ""
		switch {
		case unreachable == 1:
			also = fmt.Sprintf("; %s unreachable", hostOf(unreached))
		case unreachable > 1:
			also = fmt.Sprintf("; %s and %d more unreachable", hostOf(unreached), unreachable-1)
		}
		return OutcomeFailed, failed, fmt.Errorf("failed on %s%s%s", onHost(failed), describe(failed), also)
	case unreachable > 0:
		if v.code != 4 && v.code != 3 {
			v.mismatch = "events show an unreachable host but the exit code is not 4"
		}
		return OutcomeUnreachable, unreached, fmt.Errorf("%s unreachable%s", hostOf(unreached), describe(unreached))
	case v.code == 0:
		if ev.stats == nil {
			v.mismatch = "ansible-playbook exited 0 without a stats event: is the autoprov_events callback enabled?"
		}
		return OutcomeSucceeded, nil, nil
	case v.code == 2 && ev.stats == nil:
		v.mismatch = "exit code 2 (failed hosts) without failure events"
		return OutcomeFailed, nil, fmt.Errorf("ansible-playbook reported failed hosts (exit 2): %s", v.summary)
	default:
		return OutcomeError, nil, fmt.Errorf("ansible-playbook exited with status %d: %s", v.code, v.summary)
	}
}
