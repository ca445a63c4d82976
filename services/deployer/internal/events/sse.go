package events

import (
	"bufio"
	"cmp"
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// FinalFunc reports whether a job has reached its final state, and which.
type FinalFunc func(ctx context.Context) (status string, final bool, err error)

// StreamConfig configures Serve.
type StreamConfig struct {
	// Retry is the reconnection delay advised to clients. Default 3s.
	Retry time.Duration
	// Heartbeat is how often a comment line is sent on a quiet stream, so
	// that proxies keep it open. Default 15s.
	Heartbeat time.Duration
	// Poll is how often the job's final state is re-checked besides
	// notifications. Default 2s.
	Poll time.Duration
	// WriteTimeout drops a client that cannot take a write for this long.
	// Default 30s.
	WriteTimeout time.Duration
}

func (c *StreamConfig) defaults() {
	if c.Retry <= 0 {
		c.Retry = 3 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 15 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 2 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
}

// Request is one client's stream.
type Request struct {
	JobID string
	// Kind is the job's kind (default deploy).
	Kind        messages.JobKind
	LastEventID string
	// Final tells whether the job has ended.
	Final FinalFunc
	// Changed receives when the job may have ended (a notification).
	Changed <-chan struct{}
	// Shutdown is closed when the server shuts down: the stream then ends
	// with a retry hint, and the client reconnects to another replica.
	Shutdown <-chan struct{}
}

// Serve streams the job's events to w, starting after LastEventID, until
// the job's final event has been sent, the client goes, or the server
// shuts down. It writes the response status itself.
func (h *Hub) Serve(w http.ResponseWriter, r *http.Request, req Request, cfg StreamConfig) {
	cfg.defaults()
	ctx := r.Context()
	if req.LastEventID == FinalID {
		// The client saw the end already: 204 tells EventSource to stop.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	sub, err := h.SubscribeKind(ctx, cmp.Or(req.Kind, messages.JobKindDeploy), req.JobID, req.LastEventID)
	if err != nil {
		// Redis is away (or the client went): a client that retries
		// waits the stream's reconnection delay, as after a shutdown.
		h.cfg.Logger.Warn().Err(err).Str("job_id", req.JobID).Msg("subscribe to progress")
		w.Header().Set("Retry-After", strconv.Itoa(int(max(time.Second, cfg.Retry.Round(time.Second))/time.Second)))
		http.Error(w, "progress events are unavailable right now", http.StatusServiceUnavailable)
		return
	}
	defer sub.Close()
	if sub.SeenEnd(req.LastEventID) {
		// The client got the run's real run_finished (an EventSource
		// reconnects when the stream closes): there is nothing more, and
		// 204 stops it reconnecting.
		w.WriteHeader(http.StatusNoContent)
		return
	}

	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Connection", "keep-alive")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 8<<10)
	write := func(parts ...string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
		for _, p := range parts {
			if _, err := bw.WriteString(p); err != nil {
				return false
			}
		}
		return true
	}
	flush := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
		if bw.Flush() != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// send writes events; it reports whether the final one was among them.
	send := func(evs []Event) (final, ok bool) {
		for _, e := range evs {
			if !write("id: ", e.ID, "\nevent: ", e.Type, "\ndata: ", string(e.Data), "\n\n") {
				return false, false
			}
			if e.Final {
				return true, flush()
			}
		}
		return false, len(evs) == 0 || flush()
	}
	if !write("retry: ", itoa(cfg.Retry.Milliseconds()), "\n: following ", req.JobID, "\n\n") || !flush() {
		return
	}

	poll := time.NewTicker(cfg.Poll)
	defer poll.Stop()
	beat := time.NewTicker(cfg.Heartbeat)
	defer beat.Stop()
	first := true // a job that ended before the client came ends its stream at once
	// A check must have started after this to tell whether the job ended:
	// the time of the notification, or a poll interval ago (so that the
	// subscribers of one job share one check per interval).
	notBefore := time.Now().Add(-cfg.Poll / 2)
	for {
		evs, changed := sub.Next()
		final, ok := send(evs)
		if final || !ok {
			return
		}
		checkEnd := first
		first = false
		if !checkEnd {
			select {
			case <-ctx.Done():
				return
			case <-req.Shutdown:
				write(": server shutting down, reconnect\nretry: ", itoa(cfg.Retry.Milliseconds()), "\n\n")
				flush()
				return
			case <-changed:
				continue
			case <-req.Changed:
				checkEnd, notBefore = true, time.Now()
			case <-poll.C:
				checkEnd, notBefore = true, time.Now().Add(-cfg.Poll/2)
			case <-beat.C:
				if !write(": keepalive\n\n") || !flush() {
					return
				}
			}
		}
		if !checkEnd || req.Final == nil {
			continue
		}
		status, done, err := sub.j.finalState(ctx, notBefore, req.Final)
		if err != nil || !done {
			continue
		}
		// The job is over: deliver what its stream still holds, then end
		// with its final event, made up when the run had none.
		if err := sub.CatchUp(ctx); err != nil {
			h.cfg.Logger.Debug().Err(err).Str("job_id", req.JobID).Msg("catch up progress")
		}
		evs, _ = sub.Next()
		if final, ok := send(evs); final || !ok {
			return
		}
		if write("id: "+FinalID+"\nevent: run_finished\ndata: ", string(FinalEvent(req.JobID, status, "the job ended without more progress events", time.Now()).Data), "\n\n") {
			flush()
		}
		return
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
