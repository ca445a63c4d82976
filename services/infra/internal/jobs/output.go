package jobs

import (
	"context"
	"errors"
	"io"
	"time"
)

// errRunHandedOver ends a run's output stream without storing it.
var errRunHandedOver = errors.New("run handed over: its output is not stored")

// outputStoreTimeout bounds storing a run's output once the run ended: the
// result waits for it, and goes out without it after this long.
const outputStoreTimeout = 30 * time.Second

// runOutput streams the whole (redacted) output of a job's plays into the
// run log store: a pipe that Store.Put reads while the plays run (Put keeps
// at most its size limit in memory), ended when the job's outcome is
// stored. Several plays of one job (nuke, then setup) make one log.
type runOutput struct {
	w      *io.PipeWriter
	cancel context.CancelFunc
	done   chan error
}

// onOutput returns the ansible.Spec.OnOutput of the job's plays: each line
// (already redacted by the runner) goes to the job's run log, which it
// starts on first use; nil when no run log store is configured.
func (j *job) onOutput() func(line string) {
	if j.h.RunLogs == nil {
		return nil
	}
	if j.runOut == nil {
		r, w := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		o := &runOutput{w: w, cancel: cancel, done: make(chan error, 1)}
		j.runOut = o
		go func() {
			_, err := j.h.RunLogs.Put(ctx, j.id, r)
			_ = r.CloseWithError(err) // unblock the writer if Put failed
			o.done <- err
		}()
	}
	w := j.runOut.w
	return func(line string) {
		// Best effort: after a failed Put the pipe refuses at once.
		_, _ = io.WriteString(w, line+"\n")
	}
}

// storeOutput ends the job's output and waits until it is stored, at most
// outputStoreTimeout. A store failure is logged: the full log is
// informative, the result stands.
func (j *job) storeOutput() {
	o := j.runOut
	if o == nil {
		return
	}
	j.runOut = nil
	defer o.cancel()
	_ = o.w.Close()
	timer := time.NewTimer(outputStoreTimeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-o.done:
	case <-timer.C:
		o.cancel()
		err = <-o.done
	}
	if err != nil {
		j.log.Warn().Err(err).Str("backend", j.h.RunLogs.Backend()).Msg("full run log not stored")
	}
}

// dropOutput ends the job's output without storing it (the run is handed
// over to another attempt, which stores its own).
func (j *job) dropOutput() {
	o := j.runOut
	if o == nil {
		return
	}
	j.runOut = nil
	_ = o.w.CloseWithError(errRunHandedOver)
	o.cancel()
	<-o.done
}
