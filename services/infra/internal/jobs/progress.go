package jobs

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// progressBuffer bounds the events waiting to be published for one job.
const progressBuffer = 1024

// progress publishes a job's progress events on its own stream
// (messages.ProgressStream) from one goroutine, in order. When the buffer is
// full, routine host results (ok, changed, skipped) are dropped and counted;
// run, play and task starts, failures and the end are never dropped.
type progress struct {
	h       *Handler
	jobID   string
	stream  string
	log     zerolog.Logger
	ch      chan messages.ProgressEvent
	done    chan struct{}
	seq     int64
	dropped int
	closed  bool // emit and close do nothing once closed
}

func (h *Handler) startProgress(jobID string, log zerolog.Logger) *progress {
	p := &progress{
		h:      h,
		jobID:  jobID,
		stream: messages.ProgressStream(jobID),
		log:    log,
		ch:     make(chan messages.ProgressEvent, progressBuffer),
		done:   make(chan struct{}),
	}
	go p.loop()
	return p
}

// emit queues an event; see progress for what may be dropped. A nil or
// closed progress ignores it.
func (p *progress) emit(ev messages.ProgressEvent) {
	if p == nil || p.closed {
		return
	}
	p.seq++
	ev.JobID, ev.Seq = p.jobID, p.seq
	if ev.Time == "" {
		ev.Time = messages.FormatTime(p.h.Now())
	}
	switch ev.Type {
	case messages.EventHostOK, messages.EventHostChanged, messages.EventHostSkipped:
		select {
		case p.ch <- ev:
		default:
			p.dropped++
			p.h.Metrics.progressDropped.Inc()
		}
	default:
		p.ch <- ev
	}
}

// fromAnsible maps a callback event of the playbook run to a progress event.
func (p *progress) fromAnsible(e ansible.Event) {
	ev := messages.ProgressEvent{Play: e.Play, Task: e.Task, Host: e.Host, Message: e.Msg, Time: messages.FormatTime(e.Time)}
	switch e.Type {
	case "play_start":
		ev.Type = messages.EventPlayStarted
	case "task_start", "handler_start":
		ev.Type = messages.EventTaskStarted
	case "host_ok":
		ev.Type = messages.EventHostOK
		if e.Changed {
			ev.Type = messages.EventHostChanged
		}
	case "host_failed":
		ev.Type = messages.EventHostFailed
		if e.IgnoreErrors {
			ev.Message = "(ignored) " + ev.Message
		}
	case "host_unreachable":
		ev.Type = messages.EventHostUnreachable
	case "host_skipped":
		ev.Type = messages.EventHostSkipped
	default:
		return // playbook_start and stats have no progress event of their own
	}
	p.emit(ev)
}

// finish publishes run_finished, waits until everything is published and
// lets the stream expire after the configured TTL. A nil progress does
// nothing.
func (p *progress) finish(status messages.Status, message string) {
	if p == nil {
		return
	}
	p.emit(messages.ProgressEvent{Type: messages.EventRunFinished, Status: status, Message: message})
	p.close()
}

// abandon stops publishing without a run_finished event (the run is handed
// over to another attempt, which publishes its own events).
func (p *progress) abandon() { p.close() }

func (p *progress) close() {
	if p == nil || p.closed {
		return
	}
	p.closed = true
	close(p.ch)
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.h.Redis.Expire(ctx, p.stream, p.h.cfg.ProgressTTL).Err(); err != nil {
		p.log.Warn().Err(err).Msg("could not set the progress stream's expiry")
	}
	if p.dropped > 0 {
		p.log.Warn().Int("dropped", p.dropped).Msg("progress events dropped under load (routine host results only)")
	}
}

// loop publishes queued events in pipelined batches.
func (p *progress) loop() {
	defer close(p.done)
	batch := make([]messages.ProgressEvent, 0, 64)
	for ev := range p.ch {
		batch = append(batch[:0], ev)
	drain:
		for len(batch) < cap(batch) {
			select {
			case e, ok := <-p.ch:
				if !ok {
					break drain
				}
				batch = append(batch, e)
			default:
				break drain
			}
		}
		p.publish(batch)
	}
}

func (p *progress) publish(batch []messages.ProgressEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pipe := p.h.Redis.Pipeline()
	for i := range batch {
		data, err := messages.Encode(&batch[i])
		if err != nil {
			p.log.Warn().Err(err).Msg("progress event not encodable")
			continue
		}
		pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: p.stream, MaxLen: p.h.cfg.ProgressMaxLen, Approx: true,
			Values: map[string]any{messages.DataField: data},
		})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// Progress is best effort: the result carries the outcome.
		p.log.Warn().Err(err).Int("events", len(batch)).Msg("progress events not published")
	}
}
