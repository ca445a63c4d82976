package stream

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// recoverOwn re-reads this consumer's own pending entries (a consumer with a
// stable name restarting) and runs them again. Entries deleted from the
// stream meanwhile come back without values: they are acknowledged and
// skipped.
func (c *Consumer) recoverOwn(ctx context.Context, st *streamState) {
	start := "0"
	for ctx.Err() == nil {
		sent := time.Now()
		res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Consumer,
			Streams: []string{st.name, start}, Count: 100, Block: -1,
		}).Result()
		if err != nil {
			if !isNil(err) {
				c.log.Warn().Err(err).Str("stream", st.name).Msg("reading own pending entries failed; the claim loop will pick them up")
			}
			return
		}
		var msgs []redis.XMessage
		for _, s := range res {
			msgs = append(msgs, s.Messages...)
		}
		if len(msgs) == 0 {
			return
		}
		start = msgs[len(msgs)-1].ID
		c.log.Info().Str("stream", st.name).Int("entries", len(msgs)).Msg("re-running own pending entries")
		c.dispatchClaimed(ctx, st, msgs, sent, true)
	}
}

// claim runs one XAUTOCLAIM round on a stream with the n slots the caller
// holds: it takes over entries idle for at least Lease (their consumer died,
// or their handler failed and the retry delay passed). It returns how many
// slots it used and whether another round right away could find more.
func (c *Consumer) claim(ctx context.Context, st *streamState, n int) (used int, more bool) {
	sent := time.Now()
	msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
		Stream: st.name, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		MinIdle: c.cfg.Lease, Start: st.cursor, Count: int64(n),
	}).Result()
	defer c.emit(EventClaimRound, st.name, "")
	if err != nil {
		if ctx.Err() == nil {
			if isNoGroup(err) {
				if created, _ := c.ensureGroup(ctx, st); created {
					c.emit(EventGroupCreated, st.name, "")
				}
			} else {
				c.log.Warn().Err(err).Str("stream", st.name).Msg("xautoclaim failed")
			}
		}
		return 0, false
	}
	st.cursor = next
	if len(deleted) > 0 {
		// Redis already dropped them from the pending list.
		st.m.add(cDeleted, len(deleted))
		c.log.Warn().Str("stream", st.name).Strs("msg_ids", deleted).
			Msg("pending entries were deleted from the stream (trimmed) before they were processed")
	}
	if len(msgs) == 0 {
		return 0, next != "0-0" && len(deleted) > 0
	}
	st.m.add(cReclaimed, len(msgs))
	c.log.Info().Str("stream", st.name).Int("entries", len(msgs)).Msg("claimed idle entries")
	c.dispatchClaimed(ctx, st, msgs, sent, false)
	return len(msgs), next != "0-0"
}

// dispatchClaimed looks up the delivery counts of claimed entries and hands
// them to the workers, or dead-letters those past the limit. With acquire,
// it takes a slot per entry itself (blocking); otherwise the caller holds
// one slot per entry.
func (c *Consumer) dispatchClaimed(ctx context.Context, st *streamState, msgs []redis.XMessage, sent time.Time, acquire bool) {
	counts := c.deliveryCounts(ctx, st, msgs)
	var run []redis.XMessage
	var runCounts []int64
	for _, xm := range msgs {
		if acquire && c.slots.acquire(ctx, 1) == 0 {
			break // shutting down: left pending, claimable after the lease
		}
		n, ok := counts[xm.ID]
		switch {
		case xm.Values == nil:
			// Deleted from the stream while pending: nothing to run.
			_ = c.rdb.XAck(ctx, st.name, c.cfg.Group, xm.ID).Err()
			st.m.add(cDeleted, 1)
			c.slots.release(1)
		case !ok:
			// No longer pending for us (acknowledged or claimed meanwhile).
			c.slots.release(1)
		default:
			run = append(run, xm)
			runCounts = append(runCounts, n)
		}
	}
	c.dispatch(st, run, runCounts, sent, c.cfg.MaxDeliveries, sent)
}

// deliveryCounts returns the delivery count of each entry pending for this
// consumer, in one pipeline.
func (c *Consumer) deliveryCounts(ctx context.Context, st *streamState, msgs []redis.XMessage) map[string]int64 {
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(msgs))
	for i, xm := range msgs {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: st.name, Group: c.cfg.Group, Start: xm.ID, End: xm.ID, Count: 1, Consumer: c.cfg.Consumer,
		})
	}
	_, _ = pipe.Exec(ctx)
	counts := make(map[string]int64, len(msgs))
	for _, cmd := range cmds {
		if ps, err := cmd.Result(); err == nil && len(ps) == 1 {
			counts[ps[0].ID] = ps[0].RetryCount
		}
	}
	return counts
}

// maintainLoop samples group statistics, trims streams to what their groups
// still need, and removes long-idle consumers without pending entries.
func (c *Consumer) maintainLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.StatsInterval)
	defer t.Stop()
	var lastTrim, lastCleanup time.Time
	for {
		for _, st := range c.streams {
			c.sampleGroup(ctx, st)
		}
		now := time.Now()
		if c.cfg.TrimInterval > 0 && now.Sub(lastTrim) >= c.cfg.TrimInterval {
			lastTrim = now
			for _, st := range c.streams {
				c.trim(ctx, st)
			}
		}
		if c.cfg.ConsumerIdleDelete > 0 && now.Sub(lastCleanup) >= min(c.cfg.ConsumerIdleDelete/4, time.Hour) {
			lastCleanup = now
			for _, st := range c.streams {
				c.deleteIdleConsumers(ctx, st)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Consumer) sampleGroup(ctx context.Context, st *streamState) {
	if st.m == nil {
		return
	}
	groups, err := c.rdb.XInfoGroups(ctx, st.name).Result()
	if err != nil {
		return
	}
	for _, g := range groups {
		if g.Name == c.cfg.Group {
			st.m.setGroupInfo(g.Lag, g.Pending)
		}
	}
}

func (c *Consumer) trim(ctx context.Context, st *streamState) {
	minID, n, err := TrimToGroups(ctx, c.rdb, st.name)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn().Err(err).Str("stream", st.name).Msg("trim failed")
		}
		return
	}
	c.cfg.Metrics.addTrimmed(st.name, n)
	if n > 0 {
		c.log.Debug().Str("stream", st.name).Str("min_id", minID).Int64("removed", n).Msg("stream trimmed")
	}
}

func (c *Consumer) deleteIdleConsumers(ctx context.Context, st *streamState) {
	cs, err := c.rdb.XInfoConsumers(ctx, st.name, c.cfg.Group).Result()
	if err != nil {
		return
	}
	for _, ci := range cs {
		if ci.Name == c.cfg.Consumer || ci.Pending > 0 || ci.Idle < c.cfg.ConsumerIdleDelete {
			continue
		}
		n, err := deleteConsumerScript.Run(ctx, c.rdb, []string{st.name}, c.cfg.Group, ci.Name).Int()
		if err == nil && n == 1 {
			c.log.Info().Str("stream", st.name).Str("idle_consumer", ci.Name).Dur("idle", ci.Idle).
				Msg("removed idle consumer without pending entries")
		}
	}
}
