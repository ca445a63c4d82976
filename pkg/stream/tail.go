package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// TailConfig configures a Tail.
type TailConfig struct {
	// Stream is the stream to follow.
	Stream string
	// From is where reading starts: an entry id (reading resumes after
	// it), "0" for the whole stream, or "$" (the default) for entries added
	// from now on.
	From string
	// Count bounds the entries handed over at once. Default 256.
	Count int64
	// Block is how long one XREAD waits for new entries. Default 5s.
	Block time.Duration
	// Pause, when positive, is how long the tail waits after handing over
	// a batch smaller than Count before it reads again: under a steady flow
	// of entries each XREAD then returns the entries of a whole Pause
	// instead of one or two (far fewer round trips for the tail and for
	// Redis), and an entry reaches the handler up to Pause later.
	Pause time.Duration
	// Logger receives the tail's logs. The zero value logs nothing.
	Logger zerolog.Logger
}

// TailHandler handles a batch of entries read by a Tail, in stream order.
// An error makes the Tail hand over the same batch again after a backoff.
type TailHandler func(ctx context.Context, msgs []*Message) error

// Tail follows a stream read-only with XREAD: no consumer group, no
// acknowledgement, nothing written to Redis. It suits an observer that must
// neither need write access to another service's stream nor hold back its
// trimming (a consumer group does both: XREADGROUP and XACK are write
// commands, and a stopped group keeps TrimToGroups from removing what it
// has not read). What an observer misses while it is stopped, or what is
// trimmed before it reads it, is gone for it: use it where that is
// acceptable, such as showing another producer's requests early.
type Tail struct {
	rdb redis.UniversalClient
	cfg TailConfig
	h   TailHandler
}

// NewTail returns a Tail of cfg.Stream that hands entries to h.
func NewTail(rdb redis.UniversalClient, cfg TailConfig, h TailHandler) (*Tail, error) {
	if cfg.Stream == "" {
		return nil, errors.New("stream: tail: no stream")
	}
	if cfg.From == "" {
		cfg.From = "$"
	}
	if cfg.From != "$" && cfg.From != "0" {
		if _, err := parseID(cfg.From); err != nil {
			return nil, fmt.Errorf("stream: tail of %s: from %q: %w", cfg.Stream, cfg.From, err)
		}
	}
	if cfg.Count <= 0 {
		cfg.Count = 256
	}
	if cfg.Block <= 0 {
		cfg.Block = 5 * time.Second
	}
	if h == nil {
		return nil, errors.New("stream: tail: no handler")
	}
	return &Tail{rdb: rdb, cfg: cfg, h: h}, nil
}

// Run follows the stream until ctx is done; it returns nil then. Redis
// errors and handler errors are logged and retried with backoff: a batch
// is handed over again until its handler succeeds, so the handler should
// be idempotent.
func (t *Tail) Run(ctx context.Context) error {
	last := t.cfg.From
	if last == "$" {
		// Pin "now" to an id, so that entries added while a batch is being
		// handled or Redis is away are not skipped by a later "$".
		id, err := t.newest(ctx)
		for err != nil {
			if ctx.Err() != nil {
				return nil
			}
			t.cfg.Logger.Warn().Err(err).Str("stream", t.cfg.Stream).Msg("tail: reading the stream's newest id failed; retrying")
			sleepCtx(ctx, time.Second)
			id, err = t.newest(ctx)
		}
		last = id
	}
	bo := newBackoff()
	for ctx.Err() == nil {
		res, err := t.rdb.XRead(ctx, &redis.XReadArgs{
			Streams: []string{t.cfg.Stream, last}, Count: t.cfg.Count, Block: t.cfg.Block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			bo.Reset()
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d := bo.NextBackOff()
			t.cfg.Logger.Warn().Err(err).Str("stream", t.cfg.Stream).Dur("retry_in", d).Msg("tail: xread failed")
			sleepCtx(ctx, d)
			continue
		}
		var msgs []*Message
		for _, s := range res {
			for _, x := range s.Messages {
				msgs = append(msgs, &Message{Stream: t.cfg.Stream, ID: x.ID, Values: x.Values, Deliveries: 1})
			}
		}
		if len(msgs) == 0 {
			continue
		}
		for {
			err := t.h(ctx, msgs)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			d := bo.NextBackOff()
			t.cfg.Logger.Warn().Err(err).Str("stream", t.cfg.Stream).Str("first_id", msgs[0].ID).
				Int("entries", len(msgs)).Dur("retry_in", d).Msg("tail: handler failed; handing the batch over again")
			sleepCtx(ctx, d)
		}
		bo.Reset()
		last = msgs[len(msgs)-1].ID
		if t.cfg.Pause > 0 && int64(len(msgs)) < t.cfg.Count {
			sleepCtx(ctx, t.cfg.Pause)
		}
	}
	return nil
}

// newest returns the id of the stream's newest entry, "0-0" when it is
// empty or does not exist.
func (t *Tail) newest(ctx context.Context) (string, error) {
	xs, err := t.rdb.XRevRangeN(ctx, t.cfg.Stream, "+", "-", 1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("xrevrange %s: %w", t.cfg.Stream, err)
	}
	if len(xs) == 0 {
		return "0-0", nil
	}
	return xs[0].ID, nil
}
