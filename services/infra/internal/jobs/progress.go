package jobs

import (
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// progressBuffer bounds the events waiting to be published for one job.
const progressBuffer = 1024

// progress publishes a job's progress events on its own stream
// of its kind (messages.ProgressStream) through a stream.BatchPublisher, in order. When
// its buffer is full, routine host results (ok, changed, skipped) are
// dropped and counted; run, play and task starts, failures and the end are
// never dropped. The stream expires ProgressTTL after its last event.
type progress struct {
	h      *Handler
	jobID  string
	log    zerolog.Logger
	pub    *stream.BatchPublisher
	seq    int64
	closed bool // emit and close do nothing once closed
}

func (h *Handler) startProgress(kind messages.JobKind, jobID string, log zerolog.Logger) *progress {
	return &progress{
		h:     h,
		jobID: jobID,
		log:   log,
		pub: h.Producer.NewBatchPublisher(messages.ProgressStream(kind, jobID), stream.BatchOptions{
			MaxLen:       h.cfg.ProgressMaxLen,
			TTL:          h.cfg.ProgressTTL,
			Buffer:       progressBuffer,
			MetricsLabel: messages.ProgressStream(kind, "*"),
			Logger:       log,
		}),
	}
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
	data, err := messages.Encode(&ev)
	if err != nil {
		p.log.Warn().Err(err).Msg("progress event not encodable")
		return
	}
	switch ev.Type {
	case messages.EventHostOK, messages.EventHostChanged, messages.EventHostSkipped:
		if !p.pub.Offer(data) {
			p.h.Metrics.progressDropped.Inc()
		}
	default:
		p.pub.Publish(data)
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

// finish publishes run_finished and waits until everything is published.
// A nil progress does nothing.
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
	st := p.pub.Close()
	if st.Dropped > 0 {
		p.log.Warn().Int("dropped", st.Dropped).Msg("progress events dropped under load (routine host results only)")
	}
	if st.Failed > 0 {
		// Progress is best effort: the result carries the outcome.
		p.log.Warn().Int("failed", st.Failed).Msg("progress events not published")
	}
}
