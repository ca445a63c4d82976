package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Client is the Redis handle the runtime is opened with (a *redis.Client,
// *redis.ClusterClient or failover client, as pkg/service connects it).
// Code outside this package names it as stream.Client and hands it to the
// runtime's constructors, so that only this package (with pkg/service and
// pkg/testenv) imports go-redis; scripts/checkdeps.sh enforces that.
type Client = redis.UniversalClient

// Jobs is the door to what Redis holds about jobs beside their queues: each
// job's progress stream (messages.ProgressStream) and its cancel key
// (messages.CancelKey). Every reader of a job's progress (the deployer's
// live events and summaries, the operators' CLI) and every writer of a
// cancel request goes through it, so that the end-of-run rules are written
// once. Its zero value is not usable: see NewJobs.
type Jobs struct {
	rdb     redis.UniversalClient
	cluster bool // streams in different slots: one XREAD cannot span them
}

// NewJobs returns the Jobs of rdb.
func NewJobs(rdb redis.UniversalClient) *Jobs {
	_, cluster := rdb.(*redis.ClusterClient)
	return &Jobs{rdb: rdb, cluster: cluster}
}

// JobEvent is one entry of a job's progress stream.
type JobEvent struct {
	// ID is the stream entry id: where a later read resumes.
	ID string
	// Event is the decoded event; nil when the entry could not be decoded
	// (Err says why).
	Event *messages.ProgressEvent
	Err   error
}

// Final reports whether the event is run_finished, the last of a run.
func (e JobEvent) Final() bool {
	return e.Event != nil && e.Event.Type == messages.EventRunFinished
}

// jobEvent decodes the progress stream entry m.
func jobEvent(m *Message) JobEvent {
	ev, err := messages.DecodeProgressEvent(m.Data())
	if err != nil {
		return JobEvent{ID: m.ID, Err: err}
	}
	return JobEvent{ID: m.ID, Event: ev}
}

// Cancel asks the job to stop: it sets the job's cancel key to value for
// ttl (a job that starts within ttl is cancelled too) and returns the key.
func (j *Jobs) Cancel(ctx context.Context, kind messages.JobKind, jobID, value string, ttl time.Duration) (string, error) {
	key := messages.CancelKey(kind, jobID)
	if err := j.rdb.Set(ctx, key, value, ttl).Err(); err != nil {
		return key, fmt.Errorf("set %s: %w", key, err)
	}
	return key, nil
}

// Started reports whether the job has a progress stream (it started and
// its events are still kept).
func (j *Jobs) Started(ctx context.Context, kind messages.JobKind, jobID string) (bool, error) {
	s := messages.ProgressStream(kind, jobID)
	n, err := j.rdb.Exists(ctx, s).Result()
	if err != nil {
		return false, fmt.Errorf("exists %s: %w", s, err)
	}
	return n > 0, nil
}

// ServerTime returns Redis's clock, the clock of the stream entry ids.
func (j *Jobs) ServerTime(ctx context.Context) (time.Time, error) {
	return j.rdb.Time(ctx).Result()
}

// Events returns up to count (all when count is 0 or less) of the job's
// progress events after entry id after ("" or "0-0" for the first), in
// order; none when the job has no progress stream.
func (j *Jobs) Events(ctx context.Context, kind messages.JobKind, jobID, after string, count int64) ([]JobEvent, error) {
	s := messages.ProgressStream(kind, jobID)
	from := "-"
	if after != "" {
		from = "(" + after
	}
	var xs []redis.XMessage
	var err error
	if count > 0 {
		xs, err = j.rdb.XRangeN(ctx, s, from, "+", count).Result()
	} else {
		xs, err = j.rdb.XRange(ctx, s, from, "+").Result()
	}
	if err != nil {
		return nil, fmt.Errorf("xrange %s: %w", s, err)
	}
	evs := make([]JobEvent, len(xs))
	for i, x := range xs {
		evs[i] = jobEvent(&Message{Stream: s, ID: x.ID, Values: x.Values, Deliveries: 1})
	}
	return evs, nil
}

// Cursor is a place in a stream: a read returns the entries after ID
// ("0-0" for the first).
type Cursor struct {
	Stream string
	ID     string
}

// ReadArgs bound a read of several streams.
type ReadArgs struct {
	// Count bounds the entries read per stream. Default 1000.
	Count int64
	// Block is how long the read waits for an entry when none is there.
	// Default 1s.
	Block time.Duration
	// Poll is, on Redis Cluster, how long the read waits when none of the
	// streams had an entry. Default Block.
	Poll time.Duration
	// Wake, when not nil, cuts that wait short when it receives.
	Wake <-chan struct{}
}

func (a ReadArgs) withDefaults() ReadArgs {
	if a.Count <= 0 {
		a.Count = 1000
	}
	if a.Block <= 0 {
		a.Block = time.Second
	}
	if a.Poll <= 0 {
		a.Poll = a.Block
	}
	return a
}

// Read returns the entries after each cursor, by the cursor's index (a
// stream that does not exist yet has none). It waits up to args.Block for
// an entry of any of the streams with one blocking XREAD; it returns
// empty-handed when none came. On Redis Cluster, where one XREAD cannot span
// the hash slots of several streams (CROSSSLOT), it reads each stream with
// a non-blocking XREAD in one pipeline (which the cluster client splits by
// node), and waits args.Poll (or until args.Wake) when none had an entry.
// Read is read-only: no consumer group, nothing written.
func (j *Jobs) Read(ctx context.Context, cursors []Cursor, args ReadArgs) ([][]*Message, error) {
	args = args.withDefaults()
	out := make([][]*Message, len(cursors))
	if len(cursors) == 0 {
		return out, nil
	}
	if j.cluster {
		return out, j.poll(ctx, cursors, args, out)
	}
	xargs := make([]string, 0, 2*len(cursors))
	for _, c := range cursors {
		xargs = append(xargs, c.Stream)
	}
	for _, c := range cursors {
		xargs = append(xargs, c.ID)
	}
	res, err := j.rdb.XRead(ctx, &redis.XReadArgs{Streams: xargs, Count: args.Count, Block: args.Block}).Result()
	if errors.Is(err, redis.Nil) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("xread %d streams: %w", len(cursors), err)
	}
	index := make(map[string]int, len(cursors))
	for i, c := range cursors {
		index[c.Stream] = i
	}
	for _, s := range res {
		if i, ok := index[s.Stream]; ok {
			out[i] = messagesOf(s.Stream, s.Messages)
		}
	}
	return out, nil
}

// poll is Read on Redis Cluster.
func (j *Jobs) poll(ctx context.Context, cursors []Cursor, args ReadArgs, out [][]*Message) error {
	pipe := j.rdb.Pipeline()
	cmds := make([]*redis.XStreamSliceCmd, len(cursors))
	for i, c := range cursors {
		cmds[i] = pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{c.Stream, c.ID}, Count: args.Count, Block: -1})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("xread %d streams: %w", len(cursors), err)
	}
	got := false
	for i, c := range cmds {
		for _, s := range c.Val() {
			if len(s.Messages) > 0 {
				got = true
				out[i] = append(out[i], messagesOf(s.Stream, s.Messages)...)
			}
		}
	}
	if !got {
		select {
		case <-ctx.Done():
		case <-args.Wake:
		case <-time.After(args.Poll):
		}
	}
	return nil
}

func messagesOf(s string, xs []redis.XMessage) []*Message {
	msgs := make([]*Message, len(xs))
	for i, x := range xs {
		msgs[i] = &Message{Stream: s, ID: x.ID, Values: x.Values, Deliveries: 1}
	}
	return msgs
}

// JobCursor is a place in a job's progress stream: a read returns the
// events after ID ("0-0" for the first).
type JobCursor struct {
	Kind  messages.JobKind
	JobID string
	ID    string
}

// ReadJobs returns the progress events after each cursor, by the cursor's
// index, reading the jobs' streams together as Read does: the multi-job
// form of FollowJob, for a reader that fans many jobs out to its clients.
func (j *Jobs) ReadJobs(ctx context.Context, cursors []JobCursor, args ReadArgs) ([][]JobEvent, error) {
	cs := make([]Cursor, len(cursors))
	for i, c := range cursors {
		cs[i] = Cursor{Stream: messages.ProgressStream(c.Kind, c.JobID), ID: c.ID}
	}
	res, err := j.Read(ctx, cs, args)
	out := make([][]JobEvent, len(cursors))
	for i, msgs := range res {
		for _, m := range msgs {
			out[i] = append(out[i], jobEvent(m))
		}
	}
	return out, err
}

// FollowJob hands the job's progress events after entry id after ("" or
// "0-0" for the first) to fn, in order, until the run's run_finished
// event: it returns nil once fn got it. It waits for events with blocking
// reads of at most block (default 1s), so a job whose stream does not
// exist yet is waited for. It returns ctx's error when ctx ends first, and
// fn's error as soon as fn returns one. A read error is returned at once,
// wrapped: the caller decides whether to follow again from the last id fn
// got.
func (j *Jobs) FollowJob(ctx context.Context, kind messages.JobKind, jobID, after string, block time.Duration,
	fn func(JobEvent) error) error {
	if after == "" {
		after = "0-0"
	}
	cursors := []JobCursor{{Kind: kind, JobID: jobID, ID: after}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := j.ReadJobs(ctx, cursors, ReadArgs{Count: 1000, Block: block})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("follow job %s: %w", jobID, err)
		}
		for _, ev := range res[0] {
			cursors[0].ID = ev.ID
			if err := fn(ev); err != nil {
				return err
			}
			if ev.Final() {
				return nil
			}
		}
	}
}
