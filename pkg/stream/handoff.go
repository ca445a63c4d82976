package stream

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Entry names a stream entry.
type Entry struct {
	Stream string
	ID     string
}

// handOffKey is the context key of a delivery's hand-off list.
type handOffKey struct{}

// handOffs is what a handler asked to hand its slot to (HandOff).
type handOffs struct {
	mu      sync.Mutex
	entries []Entry
}

// HandOff asks the consumer running the handler of ctx to give the
// handler's slot, once the handler returned and its entry is settled, to
// the first of entries that waits released in the group (returned with
// Later): it is claimed and run at once on this consumer, instead of when
// its delay is over and a claim round finds it. A handler that frees what
// other entries wait for (a run's server) uses it: the first in line starts
// when the server is free, not up to a delay and a claim interval later.
//
// Only an entry idle for at least three quarters of the lease is taken:
// one released with Later (with a delay of at most a quarter of the lease)
// or given up by its consumer; an entry whose handler runs is renewed every
// quarter of the lease and is left alone. An entry that cannot be taken is
// skipped; when none can, the slot is freed as usual. Outside a handler's
// context HandOff does nothing.
func HandOff(ctx context.Context, entries ...Entry) {
	h, ok := ctx.Value(handOffKey{}).(*handOffs)
	if !ok || len(entries) == 0 {
		return
	}
	h.mu.Lock()
	h.entries = append(h.entries, entries...)
	h.mu.Unlock()
}

// take returns the hand-off list and empties it.
func (h *handOffs) take() []Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries
	h.entries = nil
	return e
}

// finish ends a delivery whose handler ran: its slot goes to an entry its
// handler handed it to (HandOff), or is freed.
func (c *Consumer) finish(d *delivery) {
	if d.handOff != nil && c.handOff(d.handOff.take()) {
		d.cancel(nil)
		c.handlers.Done()
		return
	}
	c.done(d)
}

// handOff claims the first of entries that can be taken (see HandOff) and
// dispatches it into the slot of the delivery that just ended, which the
// caller keeps; it reports whether it did.
func (c *Consumer) handOff(entries []Entry) bool {
	if len(entries) == 0 || c.draining.Load() || c.bgCtx.Err() != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(c.bgCtx, 5*time.Second)
	defer cancel()
	for _, e := range entries {
		st := c.streamNamed(e.Stream)
		if st == nil {
			continue
		}
		sent := time.Now()
		msgs, err := c.rdb.XClaim(ctx, &redis.XClaimArgs{
			Stream: st.name, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
			MinIdle: c.cfg.Lease * 3 / 4, Messages: []string{e.ID},
		}).Result()
		if err != nil {
			c.log.Warn().Err(err).Str("stream", st.name).Str("msg_id", e.ID).Msg("hand-off claim failed: the entry comes back after its delay")
			continue
		}
		if len(msgs) == 0 || msgs[0].Values == nil {
			continue // running, done, or deleted from the stream
		}
		n, ok := c.deliveryCounts(ctx, st, msgs)[e.ID]
		if !ok {
			continue
		}
		st.m.add(cReclaimed, 1)
		c.log.Info().Str("stream", st.name).Str("msg_id", e.ID).Int64("deliveries", n).
			Msg("handed the slot to an entry that waited for what its run freed")
		c.emit(EventHandedOff, st.name, e.ID)
		// Its pickup counts from the claim, right after the slot's last
		// handler returned: the time from one run's end to the next start.
		c.dispatch(st, msgs[:1], []int64{n}, sent, c.cfg.MaxDeliveries, sent)
		return true
	}
	return false
}

// streamNamed returns the state of this consumer's stream name (nil when it
// does not read it).
func (c *Consumer) streamNamed(name string) *streamState {
	for _, st := range c.streams {
		if st.name == name {
			return st
		}
	}
	return nil
}
