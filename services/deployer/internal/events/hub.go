// Package events serves the live progress of deployments as Server-Sent
// Events. A Hub reads each followed job's event stream (job:deploy:<id>:events)
// once per replica, with one blocking XREAD for all followed jobs, and
// keeps the events read in memory while someone follows the job; each
// subscriber walks that log at its own pace, so a slow client never holds
// up the reader or the other clients, and a client that reconnects with
// Last-Event-ID resumes after the last event it got.
//
// The reads go through stream.Jobs (ReadJobs): on Redis Cluster the job
// streams live in different hash slots, which one XREAD cannot span
// (CROSSSLOT), and there it polls instead, every HubConfig.Poll, with one
// non-blocking XREAD per followed job sent as a pipeline (which the
// cluster client splits by node).
package events

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Event is one progress event as sent to clients.
type Event struct {
	// ID is the stream entry id: the SSE id, for Last-Event-ID.
	ID string
	// Type is the SSE event name: the progress event's type.
	Type string
	// Data is the event as JSON.
	Data []byte
	// Final marks run_finished, the last event of a run.
	Final bool
}

// HubConfig configures a Hub. Zero values take the defaults.
type HubConfig struct {
	// Block is how long one read waits for new events; it bounds how long
	// a newly followed job waits for its first live read. Default 250ms.
	Block time.Duration
	// MaxEvents bounds the events kept per job. Default 50,000.
	MaxEvents int
	// Poll is the interval of the reads on Redis Cluster (see the package
	// documentation). Default 100ms.
	Poll   time.Duration
	Logger zerolog.Logger
}

// Hub follows the event streams of the jobs that have subscribers.
type Hub struct {
	jobs *stream.Jobs
	cfg  HubConfig

	mu       sync.Mutex
	followed map[string]*job
	kick     chan struct{}
}

// job is the in-memory log of one followed job.
type job struct {
	id   string
	kind messages.JobKind // deploy or job: the progress stream's kind

	mu      sync.Mutex
	loaded  bool
	events  []Event
	lastID  string
	changed chan struct{} // closed when events grow
	subs    int
	// finalID is the id of the run's run_finished event once read (also
	// when MaxEvents left it out of events): a client that has it has seen
	// the end.
	finalID string

	// The last check of the job's final state, shared by its subscribers
	// (see finalState).
	finalMu     sync.Mutex
	finalAt     time.Time // when the last check started
	finalStatus string
	finalDone   bool
}

// finalState returns the job's final state through check, shared by all
// subscribers of the job on this replica: a check that started at or
// after notBefore is reused, and one running is waited for, so that a
// thousand subscribers polling cost one query instead of a thousand. A
// failed check is not reused.
func (j *job) finalState(ctx context.Context, notBefore time.Time, check FinalFunc) (string, bool, error) {
	j.finalMu.Lock()
	defer j.finalMu.Unlock()
	if !j.finalAt.IsZero() && !j.finalAt.Before(notBefore) {
		return j.finalStatus, j.finalDone, nil
	}
	started := time.Now()
	status, done, err := check(ctx)
	if err != nil {
		return "", false, err
	}
	j.finalAt, j.finalStatus, j.finalDone = started, status, done
	return status, done, nil
}

// NewHub returns a Hub reading the jobs' progress through jobs.
func NewHub(jobs *stream.Jobs, cfg HubConfig) *Hub {
	if cfg.Block <= 0 {
		cfg.Block = 250 * time.Millisecond
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = 50_000
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	return &Hub{jobs: jobs, cfg: cfg, followed: map[string]*job{}, kick: make(chan struct{}, 1)}
}

// Subscription follows one job.
type Subscription struct {
	h    *Hub
	j    *job
	next int // index of the next event to deliver
	once sync.Once
}

// Subscribe follows jobID from the event after lastEventID ("" for the
// start). It loads the job's history before returning.
func (h *Hub) Subscribe(ctx context.Context, jobID, lastEventID string) (*Subscription, error) {
	return h.SubscribeKind(ctx, messages.JobKindDeploy, jobID, lastEventID)
}

// SubscribeKind is Subscribe for a job of kind (an Ansible job's progress
// stream is job:job:<id>:events).
func (h *Hub) SubscribeKind(ctx context.Context, kind messages.JobKind, jobID, lastEventID string) (*Subscription, error) {
	h.mu.Lock()
	j := h.followed[followKey(kind, jobID)]
	if j == nil {
		j = &job{id: jobID, kind: kind, changed: make(chan struct{}), lastID: "0-0"}
		h.followed[followKey(kind, jobID)] = j
	}
	j.subs++
	h.mu.Unlock()
	s := &Subscription{h: h, j: j}
	if err := h.load(ctx, j); err != nil {
		s.Close()
		return nil, err
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
	j.mu.Lock()
	s.next = j.indexAfter(lastEventID)
	j.mu.Unlock()
	return s, nil
}

// followKey is the key of a followed job: its kind and id.
func followKey(kind messages.JobKind, id string) string { return string(kind) + ":" + id }

// Close ends the subscription.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.h.mu.Lock()
		defer s.h.mu.Unlock()
		s.j.subs--
		if s.j.subs == 0 {
			delete(s.h.followed, followKey(s.j.kind, s.j.id))
		}
	})
}

// Next returns the events not yet delivered (nil when none) and a channel
// that is closed when more arrive.
func (s *Subscription) Next() ([]Event, <-chan struct{}) {
	s.j.mu.Lock()
	defer s.j.mu.Unlock()
	evs := s.j.events[s.next:]
	s.next = len(s.j.events)
	return evs, s.j.changed
}

// SeenEnd reports whether a client that last got the event lastEventID
// has seen the run's end: the job's run_finished event was read and
// lastEventID is it or a later one. The synthetic final event's id
// (FinalID) is handled by Serve before subscribing.
func (s *Subscription) SeenEnd(lastEventID string) bool {
	if lastEventID == "" {
		return false
	}
	s.j.mu.Lock()
	defer s.j.mu.Unlock()
	return s.j.finalID != "" && !idLess(lastEventID, s.j.finalID)
}

// CatchUp reads what the stream holds beyond what was read (used before
// ending a stream, so that no event published before the job's end is
// missed).
func (s *Subscription) CatchUp(ctx context.Context) error {
	return s.h.readRange(ctx, s.j)
}

// indexAfter returns the index of the first event after id.
func (j *job) indexAfter(id string) int {
	if id == "" {
		return 0
	}
	for i, e := range j.events {
		if idLess(id, e.ID) {
			return i
		}
	}
	return len(j.events)
}

// load reads the job's history once.
func (h *Hub) load(ctx context.Context, j *job) error {
	j.mu.Lock()
	loaded := j.loaded
	j.mu.Unlock()
	if loaded {
		return nil
	}
	if err := h.readRange(ctx, j); err != nil {
		return err
	}
	j.mu.Lock()
	j.loaded = true
	j.mu.Unlock()
	return nil
}

// readRange appends the entries after the job's last id.
func (h *Hub) readRange(ctx context.Context, j *job) error {
	j.mu.Lock()
	from := j.lastID
	j.mu.Unlock()
	for {
		evs, err := h.jobs.Events(ctx, j.kind, j.id, from, 1000)
		if err != nil {
			return err
		}
		h.append(j, evs)
		if len(evs) < 1000 {
			return nil
		}
		from = evs[len(evs)-1].ID
	}
}

// append adds entries (skipping any already read) and wakes subscribers.
func (h *Hub) append(j *job, entries []stream.JobEvent) {
	if len(entries) == 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	added := false
	for _, e := range entries {
		if !idLess(j.lastID, e.ID) {
			continue
		}
		j.lastID = e.ID
		ev := e.Event
		if ev == nil {
			h.cfg.Logger.Debug().Err(e.Err).Str("job_id", j.id).Msg("undecodable progress event skipped")
			continue
		}
		if ev.Type == messages.EventRunFinished {
			j.finalID = e.ID
		}
		if len(j.events) >= h.cfg.MaxEvents {
			continue
		}
		body, err := json.Marshal(jsonEvent(ev))
		if err != nil {
			continue
		}
		j.events = append(j.events, Event{ID: e.ID, Type: string(ev.Type), Data: body, Final: ev.Type == messages.EventRunFinished})
		added = true
	}
	if added {
		close(j.changed)
		j.changed = make(chan struct{})
	}
}

// Run reads the followed jobs' streams until ctx is done.
func (h *Hub) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		h.mu.Lock()
		var jobs []*job
		for _, j := range h.followed {
			j.mu.Lock()
			if j.loaded {
				jobs = append(jobs, j)
			}
			j.mu.Unlock()
		}
		h.mu.Unlock()
		if len(jobs) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-h.kick:
			case <-time.After(h.cfg.Block):
			}
			continue
		}
		if err := h.read(ctx, jobs); err != nil {
			if ctx.Err() != nil {
				continue
			}
			h.cfg.Logger.Warn().Err(err).Msg("read progress streams")
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
	}
	return nil
}

// read waits up to Block for new entries of the jobs' streams, with one
// XREAD for all of them (on Redis Cluster: polls, see the package
// documentation; a new subscription cuts the wait short).
func (h *Hub) read(ctx context.Context, jobs []*job) error {
	cursors := make([]stream.JobCursor, len(jobs))
	for i, j := range jobs {
		j.mu.Lock()
		cursors[i] = stream.JobCursor{Kind: j.kind, JobID: j.id, ID: j.lastID}
		j.mu.Unlock()
	}
	res, err := h.jobs.ReadJobs(ctx, cursors, stream.ReadArgs{Count: 1000, Block: h.cfg.Block, Poll: h.cfg.Poll, Wake: h.kick})
	for i, evs := range res {
		h.append(jobs[i], evs)
	}
	return err
}

// Followed returns how many jobs the hub follows (for metrics).
func (h *Hub) Followed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.followed)
}

// idLess compares stream entry ids.
func idLess(a, b string) bool {
	ams, aseq := splitID(a)
	bms, bseq := splitID(b)
	return ams < bms || (ams == bms && aseq < bseq)
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return m, s
}

// wireEvent is the JSON form of a progress event.
type wireEvent struct {
	JobID   string `json:"job_id"`
	Seq     int64  `json:"seq"`
	Time    string `json:"time"`
	Type    string `json:"type"`
	Play    string `json:"play,omitempty"`
	Task    string `json:"task,omitempty"`
	Host    string `json:"host,omitempty"`
	Message string `json:"message,omitempty"`
	Status  string `json:"status,omitempty"`
	// Synthetic marks a run_finished made by the deployer for a job that
	// ended without one (cancelled before it started, rejected).
	Synthetic bool `json:"synthetic,omitempty"`
}

func jsonEvent(ev *messages.ProgressEvent) wireEvent {
	return wireEvent{JobID: ev.JobID, Seq: ev.Seq, Time: ev.Time, Type: string(ev.Type), Play: ev.Play,
		Task: ev.Task, Host: ev.Host, Message: ev.Message, Status: string(ev.Status)}
}

// FinalEvent makes the run_finished event of a job that ended without one.
func FinalEvent(jobID, status, message string, at time.Time) Event {
	body, _ := json.Marshal(wireEvent{JobID: jobID, Time: messages.FormatTime(at), Type: string(messages.EventRunFinished),
		Status: status, Message: message, Synthetic: true})
	return Event{ID: FinalID, Type: string(messages.EventRunFinished), Data: body, Final: true}
}

// FinalID is the SSE id of a synthetic final event; a client reconnecting
// with it is told there is nothing more (204).
const FinalID = "end"
