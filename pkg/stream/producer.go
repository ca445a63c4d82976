package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// DefaultSafetyMaxLen is the default approximate MAXLEN of Producer: a safety
// net against unbounded growth when no consumer group reads a stream. Normal
// trimming is by group progress (TrimToGroups), which never drops an entry a
// group has not read.
const DefaultSafetyMaxLen = 1_000_000

// ProducerOptions configure a Producer. The zero value is usable.
type ProducerOptions struct {
	// SafetyMaxLen is the approximate maximum length kept by every XADD
	// (MAXLEN ~). Zero means DefaultSafetyMaxLen; a negative value disables it.
	SafetyMaxLen int64
	// Metrics records published entries; nil records nothing.
	Metrics *Metrics
	// Sign, when set, signs the data of every entry published with Publish
	// or PublishBatch for its stream (messages.Sign with the producer's
	// key); the signature goes into the SigField of the entry.
	Sign func(stream string, data []byte) (string, error)
	// OutageWait, when positive, makes Publish and PublishValues wait out
	// Redis being unreachable (refused or cut connections, a server still
	// loading its AOF, a read-only replica or no primary during a
	// failover): the XADD is retried with backoff for up to OutageWait, or
	// until ctx ends. Zero fails at once, as before.
	OutageWait time.Duration
}

// SigField is the field of an entry that holds its producer's signature
// (the wire contract's "sig").
const SigField = "sig"

// Producer appends entries to streams.
type Producer struct {
	rdb     redis.UniversalClient
	maxLen  int64
	metrics *Metrics
	sign    func(stream string, data []byte) (string, error)
	outage  time.Duration
}

// NewProducer returns a Producer that appends through rdb.
func NewProducer(rdb redis.UniversalClient, opts ProducerOptions) *Producer {
	maxLen := opts.SafetyMaxLen
	switch {
	case maxLen == 0:
		maxLen = DefaultSafetyMaxLen
	case maxLen < 0:
		maxLen = 0
	}
	return &Producer{rdb: rdb, maxLen: maxLen, metrics: opts.Metrics, sign: opts.Sign, outage: opts.OutageWait}
}

// Publish appends an entry whose DataField is data and returns its id.
//
// go-redis retries a command whose connection broke, so an entry can be
// appended twice; consumers deduplicate by job id.
func (p *Producer) Publish(ctx context.Context, stream string, data []byte) (string, error) {
	values, err := p.values(stream, data)
	if err != nil {
		return "", err
	}
	return p.PublishValues(ctx, stream, values)
}

// values are the fields of an entry holding data: DataField, and the
// signature when the producer signs.
func (p *Producer) values(stream string, data []byte) (map[string]any, error) {
	values := map[string]any{DataField: data}
	if p.sign != nil {
		sig, err := p.sign(stream, data)
		if err != nil {
			return nil, fmt.Errorf("sign entry for %s: %w", stream, err)
		}
		values[SigField] = sig
	}
	return values, nil
}

// PublishValues appends an entry with the given fields and returns its id.
// With OutageWait it waits out an unreachable Redis first.
func (p *Producer) PublishValues(ctx context.Context, stream string, values map[string]any) (string, error) {
	id, err := p.rdb.XAdd(ctx, p.args(stream, values)).Result()
	if err != nil && p.outage > 0 && Unreachable(err) {
		deadline := time.Now().Add(p.outage)
		bo := newBackoff()
		for err != nil && Unreachable(err) && time.Now().Before(deadline) {
			if clock.Sleep(ctx, nil, min(bo.NextBackOff(), time.Until(deadline))) != nil {
				break // ctx ended: the last error stands
			}
			id, err = p.rdb.XAdd(ctx, p.args(stream, values)).Result()
		}
	}
	if err != nil {
		return "", fmt.Errorf("xadd %s: %w", stream, err)
	}
	p.metrics.incPublished(stream, 1)
	return id, nil
}

// PublishBatch appends one entry per element of data in a single pipeline
// and returns their ids in order.
func (p *Producer) PublishBatch(ctx context.Context, stream string, data [][]byte) ([]string, error) {
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(data))
	for i, d := range data {
		values, err := p.values(stream, d)
		if err != nil {
			return nil, err
		}
		cmds[i] = pipe.XAdd(ctx, p.args(stream, values))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("xadd batch of %d to %s: %w", len(data), stream, err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	p.metrics.incPublished(stream, len(ids))
	return ids, nil
}

func (p *Producer) args(stream string, values map[string]any) *redis.XAddArgs {
	a := &redis.XAddArgs{Stream: stream, Values: values}
	if p.maxLen > 0 {
		a.MaxLen = p.maxLen
		a.Approx = true
	}
	return a
}

// TrimToGroups trims stream to the oldest entry any of its consumer groups
// may still need: for each group its oldest pending entry, or the entry after
// the last one delivered when nothing is pending. Trimming is approximate
// (whole radix-tree nodes), so it never drops a needed entry and is cheap. A
// stream without groups is left alone. It returns the MINID used ("" when it
// did not trim) and the number of entries removed.
func TrimToGroups(ctx context.Context, rdb redis.UniversalClient, stream string) (string, int64, error) {
	minID, err := SafeMinID(ctx, rdb, stream)
	if err != nil || minID == "" {
		return "", 0, err
	}
	n, err := rdb.XTrimMinIDApprox(ctx, stream, minID, 0).Result()
	if err != nil {
		return "", 0, fmt.Errorf("xtrim %s minid %s: %w", stream, minID, err)
	}
	return minID, n, nil
}

// SafeMinID returns the smallest id that some consumer group of stream may
// still need ("" when the stream has no groups or does not exist).
func SafeMinID(ctx context.Context, rdb redis.UniversalClient, stream string) (string, error) {
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if isNoSuchKey(err) {
			return "", nil
		}
		return "", fmt.Errorf("xinfo groups %s: %w", stream, err)
	}
	if len(groups) == 0 {
		return "", nil
	}
	var floor streamID
	for i, g := range groups {
		// Read the group's progress before its pending list: entries delivered
		// in between are pending with ids above LastDeliveredID, so the
		// minimum below stays safe.
		gf, err := parseID(g.LastDeliveredID)
		if err != nil {
			return "", fmt.Errorf("group %s of %s: %w", g.Name, stream, err)
		}
		gf = gf.next()
		if g.Pending > 0 {
			p, err := rdb.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return "", fmt.Errorf("xpending %s %s: %w", stream, g.Name, err)
			}
			if p.Count > 0 {
				lo, err := parseID(p.Lower)
				if err != nil {
					return "", fmt.Errorf("pending of %s %s: %w", stream, g.Name, err)
				}
				if lo.less(gf) {
					gf = lo
				}
			}
		}
		if i == 0 || gf.less(floor) {
			floor = gf
		}
	}
	if floor == (streamID{}) {
		return "", nil
	}
	return floor.String(), nil
}

// streamID is a parsed stream entry id.
type streamID struct{ ms, seq uint64 }

func parseID(s string) (streamID, error) {
	msPart, seqPart, ok := strings.Cut(s, "-")
	ms, err1 := strconv.ParseUint(msPart, 10, 64)
	seq, err2 := uint64(0), error(nil)
	if ok {
		seq, err2 = strconv.ParseUint(seqPart, 10, 64)
	}
	if err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("bad stream id %q", s)
	}
	return streamID{ms, seq}, nil
}

func (id streamID) less(o streamID) bool {
	return id.ms < o.ms || (id.ms == o.ms && id.seq < o.seq)
}

func (id streamID) next() streamID {
	if id.seq == ^uint64(0) {
		return streamID{id.ms + 1, 0}
	}
	return streamID{id.ms, id.seq + 1}
}

func (id streamID) String() string {
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// isNoGroup reports whether err says the stream or its group does not exist.
func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

func isBusyGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP")
}

// isNil reports whether err is redis.Nil (an empty reply, e.g. a read that
// timed out).
func isNil(err error) bool { return errors.Is(err, redis.Nil) }

// Unreachable reports whether err says Redis cannot be reached or cannot
// take writes right now (a restart, a failover): worth waiting out, unlike
// an error of the command itself.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	msg := err.Error()
	for _, prefix := range []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, prefix) || strings.Contains(msg, ": "+prefix+" ") {
			return true
		}
	}
	return false
}
