package jobs

import (
	"errors"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestVerdictFailedTaskOverUnreachable: a play where one host was
// unreachable and another failed a task fails the job as playbook_failed,
// and the result's failed task is the runner's (the task that failed, on
// its host), not the unreachable host's; a timed-out play keeps its recap
// and the running task on the host that ran it.
func TestVerdictFailedTaskOverUnreachable(t *testing.T) {
	t.Parallel()
	breaks := &ansible.FailedTask{Name: "Breaks", Host: "up", Play: "Two hosts", Message: "broken on purpose"}
	failed := &ansible.Result{Outcome: ansible.OutcomeFailed, ExitCode: 4, FailedTask: breaks,
		Hosts: map[string]ansible.Recap{"up": {OK: 1, Failed: 1}, "down": {Unreachable: 1}},
		Err:   errors.New(`failed on up in task "Breaks": broken on purpose; host down unreachable`)}
	sleep := &ansible.FailedTask{Name: "Sleep", Host: "slow", Play: "Two hosts", Message: "run exceeded its time limit"}
	timedOut := &ansible.Result{Outcome: ansible.OutcomeTimeout, ExitCode: 143, FailedTask: sleep,
		Hosts: map[string]ansible.Recap{"fast": {OK: 1, Skipped: 1}, "slow": {OK: 1}},
		Err:   errors.New("run exceeded its time limit")}
	for _, tt := range []struct {
		name   string
		res    *ansible.Result
		status messages.Status
		kind   messages.ErrorKind
		msg    string
		ft     *ansible.FailedTask
	}{
		{"failed and unreachable", failed, messages.StatusFailed, messages.KindPlaybookFailed,
			`site.yml: failed on up in task "Breaks": broken on purpose; host down unreachable`, breaks},
		{"timed out", timedOut, messages.StatusFailed, messages.KindTimeout, "site.yml: run exceeded its time limit", sleep},
	} {
		o := (&ansibleJob{}).verdict("site.yml", tt.res, tt.res.Hosts)
		if o.status != tt.status || o.kind != tt.kind || o.message != tt.msg {
			t.Errorf("%s: %s %s %q, want %s %s %q", tt.name, o.status, o.kind, o.message, tt.status, tt.kind, tt.msg)
		}
		if o.play == nil || o.play.res.FailedTask == nil || *o.play.res.FailedTask != *tt.ft {
			t.Errorf("%s: failed task %+v, want %+v", tt.name, o.play, tt.ft)
			continue
		}
		if got := o.play.res.Hosts; len(got) != len(tt.res.Hosts) {
			t.Errorf("%s: recap %v, want %v", tt.name, got, tt.res.Hosts)
		}
	}
}
