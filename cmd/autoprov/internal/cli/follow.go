package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// resultGrace is how long follow waits for a job's result after its
// run_finished event. Infra publishes the event, stores the outcome, then
// publishes the result: it comes within moments. A result that does not
// come was consumed by the services and trimmed from its stream (which
// happens within minutes of a job's end, see stream.TrimToGroups), and the
// event, kept for PROGRESS_TTL, tells the job's status instead.
const resultGrace = 10 * time.Second

// runEnd is a job's run_finished event and when follow stops waiting for
// the result after it.
type runEnd struct {
	ev   *messages.ProgressEvent
	wait time.Time // by the local clock
}

// over reports whether the wait for the result after the event is over; a
// nil runEnd (no event read yet) is not.
func (e *runEnd) over() bool { return e != nil && !time.Now().Before(e.wait) }

// endOf returns the runEnd of event ev, entry id of the job's progress
// stream: the wait for the result lasts resultGrace from when the event was
// written, by Redis's clock (an event written long ago waits no more).
func endOf(ctx context.Context, jobs *stream.Jobs, id string, ev *messages.ProgressEvent) *runEnd {
	wait := resultGrace
	ms, err := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
	if now, terr := jobs.ServerTime(ctx); err == nil && terr == nil {
		wait -= now.Sub(time.UnixMilli(ms))
	}
	return &runEnd{ev: ev, wait: time.Now().Add(max(wait, 0))}
}

// finishFromEvent ends a job whose result is no longer on the results
// streams with the status of its run_finished event ev: printed as the
// result is (--json: job_id, status, message and "from": "run_finished"),
// exit status 0 when it succeeded, 1 otherwise.
func finishFromEvent(g *globals, jobID string, ev *messages.ProgressEvent) error {
	r := &jobResult{Status: ev.Status, Raw: map[string]any{
		"job_id": jobID, "status": string(ev.Status), "message": ev.Message, "from": "run_finished",
	}}
	if ev.Status != messages.StatusSucceeded {
		r.Error = ev.Message
	}
	err := finish(g, r)
	if (err == nil || err == errJobFailed) && !g.json {
		fmt.Fprintln(g.env.Stdout, "(from the job's run_finished event: its result entry is no longer on the results streams)")
	}
	return err
}
