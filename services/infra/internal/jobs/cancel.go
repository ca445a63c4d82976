package jobs

import (
	"context"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// watchCancel polls the job's cancel key (messages.CancelKey) every
// CancelPoll and cancels the run with errUserCancel once it is set. It
// returns a function that stops watching.
func (h *Handler) watchCancel(ctx context.Context, jobID string, cancel context.CancelCauseFunc) (stop func()) {
	key := messages.CancelKey(jobID)
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(h.cfg.CancelPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := h.Redis.Exists(ctx, key).Result()
			if err == nil && n > 0 {
				h.Log.Info().Str("job_id", jobID).Msg("cancel requested")
				cancel(errUserCancel)
				return
			}
		}
	}()
	return func() { stopCtx(); <-done }
}
