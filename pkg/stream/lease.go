package stream

import (
	"context"
	"time"
)

// heartbeatLoop renews the leases of in-flight entries every Lease/4 until
// ctx is done.
func (c *Consumer) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.Lease / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.renew(ctx)
		}
	}
}

// renew resets the idle time of every owned entry not renewed for Lease/4,
// and cancels the handlers of entries found owned by someone else.
func (c *Consumer) renew(ctx context.Context) {
	due := c.cfg.Lease / 4
	now := time.Now()
	byStream := map[*streamState][]*delivery{}
	c.mu.Lock()
	for _, d := range c.inflight {
		if !d.lost && now.Sub(d.renewSent) >= due {
			byStream[d.st] = append(byStream[d.st], d)
		}
	}
	c.mu.Unlock()
	for st, ds := range byStream {
		for len(ds) > 0 {
			batch := ds[:min(len(ds), scriptBatch)]
			ds = ds[len(batch):]
			args := make([]any, 0, len(batch)+2)
			args = append(args, c.cfg.Group, c.cfg.Consumer)
			for _, d := range batch {
				args = append(args, d.msg.ID)
			}
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, c.cfg.Lease/4)
			lost, err := runFenced(rctx, c.rdb, renewScript, st.name, args)
			cancel()
			if err != nil {
				if isNoGroup(err) {
					// The group is gone, and with it our pending entries.
					lost = idsOf(batch)
				} else {
					c.log.Warn().Err(err).Str("stream", st.name).Int("entries", len(batch)).
						Msg("heartbeat failed: will retry")
					continue
				}
			}
			c.markRenewed(st, batch, lost, sent)
		}
	}
}

func idsOf(ds []*delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.msg.ID
	}
	return ids
}

// markRenewed records a renewal sent at sent, and the loss of the lost ids.
func (c *Consumer) markRenewed(st *streamState, batch []*delivery, lost []string, sent time.Time) {
	lostSet := make(map[string]bool, len(lost))
	for _, id := range lost {
		lostSet[id] = true
	}
	var cancelled []*delivery
	c.mu.Lock()
	for _, d := range batch {
		if lostSet[d.msg.ID] {
			if !d.lost {
				d.lost = true
				cancelled = append(cancelled, d)
			}
		} else {
			d.renewSent = sent
		}
	}
	c.mu.Unlock()
	if c.cfg.Hook != nil {
		for _, d := range batch {
			if !lostSet[d.msg.ID] {
				c.emit(EventRenewed, st.name, d.msg.ID)
			}
		}
	}
	for _, d := range cancelled {
		c.log.Warn().Str("stream", st.name).Str("msg_id", d.msg.ID).Msg("lease lost: cancelling handler")
		d.cancel(ErrLeaseLost)
		st.m.add(cLeaseLost, 1)
	}
}

// ackLoop acknowledges settled entries in batches until ctx is done, then
// flushes what is queued once more.
func (c *Consumer) ackLoop(ctx context.Context) {
	for {
		select {
		case <-c.acks.wake:
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for batch := c.acks.take(); len(batch) > 0; batch = c.acks.take() {
				c.flushAcks(fctx, batch)
			}
			return
		}
		for batch := c.acks.take(); len(batch) > 0; batch = c.acks.take() {
			c.flushAcks(ctx, batch)
		}
	}
}

// waitAcksFlushed waits until nothing is in flight any more (every entry
// acknowledged, released or left), or until d passes.
func (c *Consumer) waitAcksFlushed(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for c.inFlight() > 0 {
		select {
		case <-c.emptied:
		case <-t.C:
			return
		}
	}
}

// flushAcks acknowledges a batch, retrying until it succeeds or ctx is done.
// Entries renewed less than Lease/2 ago cannot have been claimed by anyone
// (claimers wait for an idle time of Lease), so they take a plain XACK; older
// ones take the fenced script, so that an entry another consumer took over is
// never acknowledged from under it.
func (c *Consumer) flushAcks(ctx context.Context, batch []*delivery) {
	type group struct {
		plain, fenced []*delivery
	}
	byStream := map[*streamState]*group{}
	now := time.Now()
	c.mu.Lock()
	for _, d := range batch {
		g := byStream[d.st]
		if g == nil {
			g = &group{}
			byStream[d.st] = g
		}
		switch {
		case d.lost:
			// Lost while queued: leave it to its new owner.
			c.emit(EventLeft, d.st.name, d.msg.ID)
		case now.Sub(d.renewSent) < c.cfg.Lease/2:
			g.plain = append(g.plain, d)
		default:
			g.fenced = append(g.fenced, d)
		}
	}
	c.mu.Unlock()

	bo := newBackoff()
	for st, g := range byStream {
		for len(g.plain) > 0 {
			chunk := g.plain[:min(len(g.plain), 4096)]
			err := c.rdb.XAck(ctx, st.name, c.cfg.Group, idsOf(chunk)...).Err()
			if err != nil {
				if ctx.Err() != nil {
					c.log.Warn().Err(err).Int("entries", len(chunk)).Msg("acks not sent: entries will be redelivered")
					c.emitEach(EventLeft, g.plain)
					break
				}
				c.log.Warn().Err(err).Str("stream", st.name).Msg("xack failed: retrying")
				sleepCtx(ctx, bo.NextBackOff())
				continue
			}
			c.acked(st, chunk)
			g.plain = g.plain[len(chunk):]
		}
		for len(g.fenced) > 0 {
			chunk := g.fenced[:min(len(g.fenced), scriptBatch)]
			args := append([]any{c.cfg.Group, c.cfg.Consumer}, toAny(idsOf(chunk))...)
			lost, err := runFenced(ctx, c.rdb, ackScript, st.name, args)
			if err != nil {
				if ctx.Err() != nil || isNoGroup(err) {
					c.log.Warn().Err(err).Int("entries", len(chunk)).Msg("acks not sent: entries will be redelivered")
					c.emitEach(EventLeft, g.fenced)
					break
				}
				c.log.Warn().Err(err).Str("stream", st.name).Msg("fenced ack failed: retrying")
				sleepCtx(ctx, bo.NextBackOff())
				continue
			}
			acked := chunk
			if len(lost) > 0 {
				st.m.add(cLeaseLost, len(lost))
				c.log.Warn().Strs("msg_ids", lost).Str("stream", st.name).Msg("not acknowledged: taken over by another consumer")
				acked = c.leave(chunk, lost)
			}
			c.acked(st, acked)
			g.fenced = g.fenced[len(chunk):]
		}
	}
	// Anything left (ctx done) stays pending in Redis and is redelivered.
	c.forget(batch...)
}

func (c *Consumer) acked(st *streamState, ds []*delivery) {
	st.m.add(cAcked, len(ds))
	c.forget(ds...)
	c.emitEach(EventAcked, ds)
}

// leave reports the deliveries of chunk whose ids are in lost as left, and
// returns the others.
func (c *Consumer) leave(chunk []*delivery, lost []string) []*delivery {
	lostSet := make(map[string]bool, len(lost))
	for _, id := range lost {
		lostSet[id] = true
	}
	kept := make([]*delivery, 0, len(chunk))
	for _, d := range chunk {
		if lostSet[d.msg.ID] {
			c.emit(EventLeft, d.st.name, d.msg.ID)
		} else {
			kept = append(kept, d)
		}
	}
	return kept
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
