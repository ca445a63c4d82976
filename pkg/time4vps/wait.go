package time4vps

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// WaitTask polls a task every TaskPollInterval until it completes, and
// returns its final state. Bound the wait with ctx's deadline.
//
//   - completed and not failed: (task, nil);
//   - completed and failed (see LooksFailed and WithTaskFailureFunc):
//     (task, *TaskFailedError), matching ErrTaskFailed;
//   - ctx done first: (last state seen or nil, error matching ctx.Err());
//   - a permanent API error (auth, not found, error body): (last, that error).
//
// A poll that fails with a temporary error (network, 429, 5xx, after the
// GET's own retries) is logged and the polling goes on. Progress is logged on
// every state change (pending, running, completed) and each poll at debug
// level; the task's results are never logged.
func (c *Client) WaitTask(ctx context.Context, serverID, taskID int64) (*Task, error) {
	if err := checkID("server", serverID); err != nil {
		return nil, err
	}
	if err := checkID("task", taskID); err != nil {
		return nil, err
	}
	log := c.log.With().Int64("server_id", serverID).Int64("task_id", taskID).Logger()
	start := time.Now()
	var (
		last      *Task
		lastState string
		timer     *time.Timer
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for poll := 1; ; poll++ {
		t, err := c.Task(ctx, serverID, taskID)
		switch {
		case err == nil:
			last = t
			elapsed := time.Since(start).Round(time.Millisecond)
			if st := t.State(); st != lastState {
				log.Info().Str("task", t.Name).Str("state", st).Int("poll", poll).Dur("elapsed", elapsed).
					Msg("time4vps task progress")
				lastState = st
			} else {
				log.Debug().Str("task", t.Name).Str("state", st).Int("poll", poll).Dur("elapsed", elapsed).
					Msg("time4vps task still " + st)
			}
			if t.Done() {
				if c.taskFailed(*t) {
					log.Warn().Str("task", t.Name).Dur("elapsed", elapsed).Msg("time4vps task failed")
					return t, &TaskFailedError{ServerID: serverID, TaskID: taskID, Task: *t}
				}
				return t, nil
			}
		case ctx.Err() != nil:
			return last, fmt.Errorf("wait for task %d on server %d (%d polls): %w", taskID, serverID, poll, ctx.Err())
		case isTemporary(err):
			log.Warn().Err(err).Int("poll", poll).Msg("time4vps task poll failed; polling on")
		default:
			return last, fmt.Errorf("wait for task %d on server %d: %w", taskID, serverID, err)
		}

		if timer == nil {
			timer = time.NewTimer(c.cfg.TaskPollInterval)
		} else {
			timer.Reset(c.cfg.TaskPollInterval)
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("wait for task %d on server %d (%d polls): %w", taskID, serverID, poll, ctx.Err())
		case <-timer.C:
		}
	}
}

// isTemporary reports whether a failed GET may succeed if repeated later.
func isTemporary(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Temporary()
	}
	var te *TransportError
	return errors.As(err, &te)
}
