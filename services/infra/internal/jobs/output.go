package jobs

import (
	"context"
	"errors"
	"io"
	"time"
)

// errRunHandedOver ends a run's output stream without storing it.
var errRunHandedOver = errors.New("run handed over: its output is not stored")

// runOutput streams the whole (redacted) output of a job's plays into the
// run log store: a pipe that Store.Put reads while the plays run (Put keeps
// at most its size limit in memory), ended when the job's outcome is
// stored. Several plays of one job (nuke, then setup) make one log.
type runOutput struct {
	w    *io.PipeWriter
	done chan error
}

// output returns the writer of the job's run log, starting it on first
// use; nil when no run log store is configured.
func (j *job) output() io.Writer {
	if j.h.RunLogs == nil {
		return nil
	}
	if j.runOut == nil {
		r, w := io.Pipe()
		o := &runOutput{w: w, done: make(chan error, 1)}
		j.runOut = o
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
			defer cancel()
			_, err := j.h.RunLogs.Put(ctx, j.id, r)
			_ = r.CloseWithError(err) // unblock the writer if Put failed
			o.done <- err
		}()
	}
	return j.runOut.w
}

// storeOutput ends the job's output and waits until it is stored. A store
// failure is logged: the full log is informative, the result stands.
func (j *job) storeOutput() {
	if j.runOut == nil {
		return
	}
	_ = j.runOut.w.Close()
	if err := <-j.runOut.done; err != nil {
		j.log.Warn().Err(err).Str("backend", j.h.RunLogs.Backend()).Msg("full run log not stored")
	}
	j.runOut = nil
}

// dropOutput ends the job's output without storing it (the run is handed
// over to another attempt, which stores its own).
func (j *job) dropOutput() {
	if j.runOut == nil {
		return
	}
	_ = j.runOut.w.CloseWithError(errRunHandedOver)
	<-j.runOut.done
	j.runOut = nil
}
