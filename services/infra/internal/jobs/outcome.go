package jobs

import (
	"errors"
	"fmt"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// outcome is how a job ends, as its result says it: a status, an error kind
// and a message, and the playbook run that decided it when one did.
//
// Every step that can end a job returns its outcome: the last play as a
// value, an earlier end (a server that stays down, a key that cannot work, a
// provider that refuses, a nuke that failed) as an error, the way asynq's
// SkipRetry or river's JobCancel steer a job from deep inside it. Errors that
// are not outcomes are infrastructure failures: retried. runLocked (or end,
// for a request that never got a run) records the outcome in the result
// once, redacted; nothing else writes the result.
type outcome struct {
	status  messages.Status
	kind    messages.ErrorKind // empty when the job succeeded
	message string             // raw text: record redacts it
	play    *playReport        // nil when no playbook run decided it
}

// playReport is what a playbook run adds to a result.
type playReport struct {
	playbook string
	res      *ansible.Result
}

// Error lets an outcome that ends a job early travel as an error.
func (o *outcome) Error() string {
	return fmt.Sprintf("job ends %s (%s): %s", o.status, o.kind, o.message)
}

func (o *outcome) succeeded() bool { return o.status == messages.StatusSucceeded }

// fail returns the outcome of a job that ends with status and kind, the
// message formatted as fmt.Sprintf does.
func fail(status messages.Status, kind messages.ErrorKind, format string, args ...any) *outcome {
	return &outcome{status: status, kind: kind, message: fmt.Sprintf(format, args...)}
}

// asOutcome returns the outcome err is or wraps, if any.
func asOutcome(err error) (*outcome, bool) {
	var o *outcome
	ok := errors.As(err, &o)
	return o, ok
}

// playVerdict is the status and error kind of how a playbook run ended.
type playVerdict struct {
	status messages.Status
	kind   messages.ErrorKind
}

// playVerdicts maps every ansible.Outcome to the result's status and kind;
// an outcome missing here (a newer one) counts as an internal error.
var playVerdicts = map[ansible.Outcome]playVerdict{
	ansible.OutcomeSucceeded:   {messages.StatusSucceeded, ""},
	ansible.OutcomeFailed:      {messages.StatusFailed, messages.KindPlaybookFailed},
	ansible.OutcomeUnreachable: {messages.StatusUnreachable, messages.KindHostsUnreachable},
	ansible.OutcomeTimeout:     {messages.StatusFailed, messages.KindTimeout},
	ansible.OutcomeIdleTimeout: {messages.StatusFailed, messages.KindIdleTimeout},
	ansible.OutcomeCancelled:   {messages.StatusCancelled, messages.KindCancelled},
	ansible.OutcomeError:       {messages.StatusFailed, messages.KindInternal},
}

// playOutcome is the outcome of a finished playbook run.
func playOutcome(playbook string, res *ansible.Result) *outcome {
	v, ok := playVerdicts[res.Outcome]
	if !ok {
		v = playVerdict{messages.StatusFailed, messages.KindInternal}
	}
	o := &outcome{status: v.status, kind: v.kind, message: playbook, play: &playReport{playbook: playbook, res: res}}
	if res.Err != nil {
		o.message = fmt.Sprintf("%s: %v", playbook, res.Err)
	}
	return o
}

// cancelledOnRequest is the outcome of a run whose cancel key was set; it
// keeps the report of the play it stopped.
func cancelledOnRequest(o *outcome) *outcome {
	c := fail(messages.StatusCancelled, messages.KindCancelled, "cancelled on request")
	if o != nil {
		c.play = o.play
	}
	return c
}

// record writes o into the job's result: the one place a job's outcome
// enters it, and where its text is redacted.
func (j *job) record(o *outcome) {
	out := j.out
	if j.run != nil {
		out.Attempt = j.run.Attempt
	}
	out.Playbook = j.playbook
	if p := o.play; p != nil {
		out.Playbook = p.playbook
		out.Hosts = nil
		if len(p.res.Hosts) > 0 {
			out.Hosts = make(map[string]messages.HostRecap, len(p.res.Hosts))
			for h, r := range p.res.Hosts {
				out.Hosts[h] = messages.HostRecap{Ok: r.OK, Changed: r.Changed, Failed: r.Failed,
					Unreachable: r.Unreachable, Skipped: r.Skipped, Rescued: r.Rescued, Ignored: r.Ignored}
			}
		}
		out.FailedTask = nil
		if ft := p.res.FailedTask; ft != nil {
			out.FailedTask = &messages.FailedTask{Name: ft.Name, Host: ft.Host, Play: ft.Play, Message: j.red.RedactString(ft.Message)}
		}
		out.SetOutputTail(j.red.RedactString(p.res.OutputTail))
	}
	if o.succeeded() {
		out.Succeed()
	} else {
		out.Fail(o.status, o.kind, j.red.RedactString(o.message))
	}
	out.SetTimes(j.started, j.h.Now())
}
