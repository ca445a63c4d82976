package jobs

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// watchCancel cancels the run with errUserCancel once the job's cancel key
// of its kind (messages.CancelKey) is set. The handler's one stream.KeyWatcher checks
// the cancel keys of all running jobs together, every CancelPoll. It
// returns a function that stops watching.
func (h *Handler) watchCancel(_ context.Context, kind messages.JobKind, jobID string, cancel context.CancelCauseFunc) (stop func()) {
	return h.cancels.Watch(messages.CancelKey(kind, jobID), func() {
		h.Log.Info().Str("job_id", jobID).Msg("cancel requested")
		cancel(errUserCancel)
	})
}
