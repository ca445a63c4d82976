package stream

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// readLoop serves its streams while ctx lives: it re-runs this consumer's
// own pending entries at start, then, with the slots it holds, claims idle
// entries of each stream every ClaimInterval and reads new ones of all its
// streams in one blocking XREADGROUP, so that a free slot serves whichever
// stream has work the moment it arrives (a reader per stream, each holding
// a slot through its blocking read, would leave a busy stream waiting for
// the quiet ones' reads to time out). Claiming and reading share the loop
// so that neither can starve the other of slots: when a claim took slots,
// the next turn reads even if another claim is due (an entry that keeps
// coming back, stream.Later, would otherwise take every turn when slots are
// scarce and the reader waits for them longer than ClaimInterval).
//
// XREADGROUP's COUNT bounds each stream, not the reply: when several
// streams answer at once with more entries than the reader holds slots,
// the reader keeps as many as it holds, taken from the streams in turn,
// and gives the rest back to the group at once (claimable by any consumer,
// its delivery not counted), to claim them itself when a slot frees.
func (c *Consumer) readLoop(ctx context.Context, sts []*streamState) {
	for _, st := range sts {
		c.recoverOwn(ctx, st)
	}
	bo := newBackoff()
	// The read itself must not be abandoned half-way at shutdown: entries in
	// its reply are already ours.
	rctx := context.WithoutCancel(ctx)
	keys := make([]string, 0, 2*len(sts))
	for _, st := range sts {
		keys = append(keys, st.name)
		st.nextClaim = time.Now()
	}
	for range sts {
		keys = append(keys, ">")
	}
	claimedLast := false
	turn := 0
	for ctx.Err() == nil {
		n := c.slots.acquire(ctx, c.share())
		if n == 0 {
			return
		}
		ready := time.Now()
		turn++
		if !claimedLast {
			for i := range sts {
				st := sts[(turn+i)%len(sts)]
				if n == 0 || time.Now().Before(st.nextClaim) {
					continue
				}
				used, more := c.claim(ctx, st, n)
				claimedLast = claimedLast || used > 0
				n -= used
				st.nextClaim = time.Now().Add(c.cfg.ClaimInterval)
				if more {
					st.nextClaim = time.Now() // more idle entries may be waiting
				}
			}
			if n == 0 {
				continue
			}
		}
		claimedLast = false
		// Block no longer than the next claim round is due.
		nextClaim := sts[0].nextClaim
		for _, st := range sts[1:] {
			if st.nextClaim.Before(nextClaim) {
				nextClaim = st.nextClaim
			}
		}
		block := max(min(c.cfg.Block, time.Until(nextClaim)), time.Millisecond)
		sent := time.Now()
		res, err := c.rdb.XReadGroup(rctx, &redis.XReadGroupArgs{
			Group:    c.cfg.Group,
			Consumer: c.cfg.Consumer,
			Streams:  keys,
			Count:    int64(n),
			Block:    block,
		}).Result()
		if err != nil {
			c.slots.release(n)
			if isNil(err) {
				continue
			}
			c.readError(ctx, sts, "xreadgroup", err, bo)
			continue
		}
		bo.Reset()
		got := c.dispatchRead(sts, res, n, turn, sent, ready)
		c.slots.release(n - got)
	}
}

// dispatchRead dispatches at most n of the entries one read returned,
// taken from the streams in turn starting at turn, and gives the others
// back to the group (see readLoop). It returns how many it dispatched.
func (c *Consumer) dispatchRead(sts []*streamState, res []redis.XStream, n, turn int, sent, ready time.Time) int {
	byName := make(map[string][]redis.XMessage, len(res))
	total := 0
	for _, s := range res {
		byName[s.Stream] = append(byName[s.Stream], s.Messages...)
		total += len(s.Messages)
	}
	keep := make(map[string]int, len(res))
	if total <= n {
		for name, msgs := range byName {
			keep[name] = len(msgs)
		}
	} else {
		for kept := 0; kept < n; {
			for i := range sts {
				name := sts[(turn+i)%len(sts)].name
				if kept < n && keep[name] < len(byName[name]) {
					keep[name]++
					kept++
				}
			}
		}
	}
	got := 0
	for _, st := range sts {
		msgs := byName[st.name]
		k := keep[st.name]
		c.dispatch(st, msgs[:k], nil, sent, 0, ready)
		got += k
		if k < len(msgs) {
			c.giveBack(st, msgs[k:])
		}
	}
	return got
}

// giveBack makes entries this consumer read but will not run now
// claimable at once by any consumer, their delivery not counted, and makes
// st's claim round due. When Redis cannot be reached they become claimable
// when their lease runs out anyway.
func (c *Consumer) giveBack(st *streamState, msgs []redis.XMessage) {
	st.nextClaim = time.Now()
	args := make([]any, 0, 3+2*len(msgs))
	args = append(args, c.cfg.Group, c.cfg.Consumer, releaseIdle.Milliseconds())
	ids := make([]string, len(msgs))
	for i, xm := range msgs {
		args = append(args, xm.ID, 0)
		ids[i] = xm.ID
	}
	ctx, cancel := context.WithTimeout(c.bgCtx, 5*time.Second)
	defer cancel()
	if _, err := runFenced(ctx, c.rdb, releaseScript, st.name, args); err != nil {
		c.log.Warn().Err(err).Str("stream", st.name).Strs("msg_ids", ids).
			Msg("giving back entries failed: they become claimable when their lease runs out")
		return
	}
	st.m.add(cReleased, len(msgs))
	for _, id := range ids {
		c.emit(EventReleased, st.name, id)
	}
}

// readError handles a failed read: a missing group is created again (Redis
// restarted without persistence, or the stream was deleted); anything else
// backs off.
func (c *Consumer) readError(ctx context.Context, sts []*streamState, op string, err error, bo *backoff.ExponentialBackOff) {
	names := make([]string, len(sts))
	for i, st := range sts {
		names[i] = st.name
	}
	if isNoGroup(err) {
		// The reply does not say which stream lost its group: ensure all.
		c.log.Warn().Strs("streams", names).Msg("consumer group missing (Redis lost its data?): creating it again")
		ok := true
		for _, st := range sts {
			created, gerr := c.ensureGroup(ctx, st)
			if created {
				c.emit(EventGroupCreated, st.name, "")
			}
			ok = ok && gerr == nil
		}
		if ok {
			return
		}
	}
	d := bo.NextBackOff()
	c.log.Warn().Err(err).Strs("streams", names).Dur("retry_in", d).Msg(op + " failed")
	sleepCtx(ctx, d)
}

// dispatch registers entries as in flight and hands them to the workers.
// The caller holds one slot per entry, which the worker releases. counts
// gives the entries' delivery counts (nil: first delivery); entries whose
// count exceeds limit (when limit > 0) are dead-lettered without running.
// ready is when the consumer took the entries' slots (its reader, a claim
// round, a hand-off): see Message.Pickup.
func (c *Consumer) dispatch(st *streamState, msgs []redis.XMessage, counts []int64, renewSent time.Time, limit int64, ready time.Time) {
	if len(msgs) == 0 {
		return
	}
	ds := make([]delivery, len(msgs))
	ms := make([]Message, len(msgs))
	run := 0
	c.mu.Lock()
	for i, xm := range msgs {
		n := int64(1)
		if counts != nil {
			n = counts[i]
		}
		ms[i] = Message{Stream: st.name, ID: xm.ID, Values: xm.Values, Deliveries: n}
		d := &ds[i]
		d.msg, d.st, d.renewSent, d.ready = &ms[i], st, renewSent, ready
		d.overLimit = limit > 0 && n > limit
		d.handOff = &handOffs{}
		d.ctx, d.cancel = context.WithCancelCause(context.WithValue(c.hctx, handOffKey{}, d.handOff))
		c.inflight[deliveryKey{st.name, xm.ID}] = d
		if !d.overLimit {
			run++
		}
	}
	c.mu.Unlock()
	st.m.inFlightAdd(len(msgs))
	st.m.add(cConsumed, run)
	c.handlers.Add(len(msgs))
	for i := range ds {
		c.work <- &ds[i]
	}
}

// process runs the handler for one delivery and settles the entry. An
// entry that waited (prefetched) is not started when its lease was lost
// meanwhile, nor when the consumer is shutting down: it is released then.
func (c *Consumer) process(d *delivery) {
	switch c.start(d) {
	case startLost:
		log := c.entryLog(d)
		log.Warn().Msg("lease lost before the handler started: entry left to its new owner")
		c.forget(d)
		c.emit(EventLeft, d.st.name, d.msg.ID)
		c.done(d)
		return
	case startDraining:
		c.releaseUnstarted([]*delivery{d})
		return
	}
	defer c.finish(d)
	if d.overLimit {
		c.deadLetter(d, "max_deliveries",
			fmt.Errorf("delivered %d times without success (handlers failed or their consumers died)", d.msg.Deliveries))
		return
	}
	start := time.Now()
	if !d.ready.IsZero() {
		d.msg.Pickup = pickup(d.msg.ID, d.ready, start)
	}
	err := c.call(d)
	d.st.m.observe(time.Since(start).Seconds())
	c.settle(d, err)
}

type startResult int

const (
	startOK startResult = iota
	startLost
	startDraining
)

// start tells whether a worker may run a delivery it took: not when its
// lease was lost, nor when the consumer is shutting down.
func (c *Consumer) start(d *delivery) startResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case d.lost:
		return startLost
	case c.draining.Load():
		return startDraining
	}
	return startOK
}

// done ends a dispatched delivery: its slot is free again.
func (c *Consumer) done(d *delivery) {
	d.cancel(nil)
	c.slots.release(1)
	c.handlers.Done()
}

// releaseWaiting releases, at shutdown, the dispatched entries no worker
// took yet.
func (c *Consumer) releaseWaiting() {
	var ds []*delivery
	for {
		select {
		case d := <-c.work:
			ds = append(ds, d)
			continue
		default:
		}
		break
	}
	c.releaseUnstarted(ds)
}

// releaseUnstarted gives entries whose handler never started back to the
// group at once, without counting their delivery, and ends them. An entry
// whose lease was lost meanwhile is left to its new owner.
func (c *Consumer) releaseUnstarted(ds []*delivery) {
	if len(ds) == 0 {
		return
	}
	byStream := map[*streamState][]*delivery{}
	var lost []*delivery
	c.mu.Lock()
	for _, d := range ds {
		if d.lost {
			lost = append(lost, d)
			continue
		}
		byStream[d.st] = append(byStream[d.st], d)
	}
	c.mu.Unlock()
	c.forget(lost...)
	c.emitEach(EventLeft, lost)
	for st, sds := range byStream {
		c.release(st, sds, releaseIdle, true, EventReleased)
		c.log.Info().Str("stream", st.name).Int("entries", len(sds)).Msg("shutdown: released prefetched entries")
	}
	for _, d := range ds {
		c.done(d)
	}
}

// pickup is the wait of entry id from the later of its arrival (the time
// in its id) and ready until start (see Message.Pickup). Redis's clock may
// differ a little from this host's: the arrival counts only when it falls
// between ready and start.
func pickup(id string, ready, start time.Time) time.Duration {
	from := ready
	ms, _, _ := strings.Cut(id, "-")
	if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
		if arrived := time.UnixMilli(n); arrived.After(from) && arrived.Before(start) {
			from = arrived
		}
	}
	return start.Sub(from)
}

// call runs the handler, turning a panic into an error.
func (c *Consumer) call(d *delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.New(c.redact(fmt.Sprintf("handler panic: %v", r)))
			c.log.Error().Str("stream", d.st.name).Str("msg_id", d.msg.ID).Str("panic", c.redact(fmt.Sprint(r))).
				Str("stack", c.redact(string(debug.Stack()))).Msg("handler panicked")
		}
	}()
	return c.handler.Handle(d.ctx, d.msg)
}

// settle decides the fate of an entry once its handler returned.
func (c *Consumer) settle(d *delivery, err error) {
	if c.isLost(d) {
		log := c.entryLog(d)
		log.Warn().Str("handler_error", c.errText(err)).Msg("lease lost: entry left to its new owner")
		c.forget(d)
		c.emit(EventLeft, d.st.name, d.msg.ID)
		return
	}
	if err == nil {
		c.enqueueAck(d)
		return
	}
	var later *LaterError
	if errors.As(err, &later) && !errors.Is(context.Cause(d.ctx), ErrShutdown) {
		delay := min(later.Delay, c.cfg.Lease)
		log := c.entryLog(d)
		log.Info().Str("reason", c.errText(later.Err)).Dur("retry_in", delay).Msg("entry not done yet: it will be delivered again")
		c.release(d.st, []*delivery{d}, c.cfg.Lease-delay, true, EventRetry)
		return
	}
	d.st.m.add(cFailed, 1)
	log := c.entryLog(d)
	var perm *PermanentError
	switch {
	case errors.As(err, &perm):
		log.Warn().Str("error", c.errText(err)).Msg("permanent failure: dead-lettering")
		c.deadLetter(d, perm.Reason, err)
	case errors.Is(context.Cause(d.ctx), ErrShutdown):
		log.Info().Str("error", c.errText(err)).Msg("interrupted by shutdown: releasing entry to other consumers")
		c.release(d.st, []*delivery{d}, releaseIdle, true, EventReleased)
	case d.msg.Deliveries >= c.cfg.MaxDeliveries:
		log.Warn().Str("error", c.errText(err)).Msg("delivery limit reached: dead-lettering")
		c.deadLetter(d, "max_deliveries", fmt.Errorf("failed on delivery %d of %d: %w", d.msg.Deliveries, c.cfg.MaxDeliveries, err))
	default:
		delay := c.retryDelay(d.msg.Deliveries)
		log.Warn().Str("error", c.errText(err)).Dur("retry_in", delay).Msg("handler failed: entry will be redelivered")
		c.release(d.st, []*delivery{d}, c.cfg.Lease-delay, false, EventRetry)
	}
}

// redact masks secrets in text with Config.Redact.
func (c *Consumer) redact(text string) string {
	if c.cfg.Redact == nil {
		return text
	}
	return c.cfg.Redact(text)
}

// errText is the redacted text of a handler's error ("" for nil).
func (c *Consumer) errText(err error) string {
	if err == nil {
		return ""
	}
	return c.redact(err.Error())
}

// entryLog returns a logger carrying the entry's identifiers.
func (c *Consumer) entryLog(d *delivery) zerolog.Logger {
	return c.log.With().Str("stream", d.st.name).Str("msg_id", d.msg.ID).Int64("deliveries", d.msg.Deliveries).Logger()
}

// retryDelay is the backoff before delivery n+1 after delivery n failed.
func (c *Consumer) retryDelay(n int64) time.Duration {
	d := c.cfg.RetryBackoff
	for i := int64(1); i < n && d < c.cfg.Lease; i++ {
		d *= 2
	}
	return min(d, c.cfg.Lease)
}

func (c *Consumer) isLost(d *delivery) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return d.lost
}

// forget drops entries from the in-flight set.
func (c *Consumer) forget(ds ...*delivery) {
	if len(ds) == 0 {
		return
	}
	removed := map[*streamState]int{}
	c.mu.Lock()
	for _, d := range ds {
		k := deliveryKey{d.st.name, d.msg.ID}
		if cur, ok := c.inflight[k]; ok && cur == d {
			delete(c.inflight, k)
			removed[d.st]++
		}
	}
	empty := len(c.inflight) == 0
	c.mu.Unlock()
	for st, n := range removed {
		st.m.inFlightAdd(-n)
	}
	if empty {
		select {
		case c.emptied <- struct{}{}:
		default:
		}
	}
}

// releaseBatch bounds the entries of one release script call (two
// arguments each).
const releaseBatch = scriptBatch / 2

// release makes owned entries of st claimable after Lease - idle and forgets
// them. With uncount, the delivery that is ending does not count: the
// entry's delivery count goes back by one. Each released entry is reported
// as kind; entries found owned by another consumer as EventLeft. When Redis
// cannot be reached the entries become claimable when their lease runs out
// anyway.
func (c *Consumer) release(st *streamState, ds []*delivery, idle time.Duration, uncount bool, kind EventKind) {
	defer c.forget(ds...)
	for len(ds) > 0 {
		batch := ds[:min(len(ds), releaseBatch)]
		ds = ds[len(batch):]
		args := make([]any, 0, 3+2*len(batch))
		args = append(args, c.cfg.Group, c.cfg.Consumer, idle.Milliseconds())
		for _, d := range batch {
			rc := int64(-1)
			if uncount {
				rc = max(d.msg.Deliveries-1, 0)
			}
			args = append(args, d.msg.ID, rc)
		}
		ctx, cancel := context.WithTimeout(c.bgCtx, 5*time.Second)
		lost, err := runFenced(ctx, c.rdb, releaseScript, st.name, args)
		cancel()
		if err != nil {
			c.log.Warn().Err(err).Str("stream", st.name).Strs("msg_ids", idsOf(batch)).
				Msg("release failed: entries become claimable when their lease runs out")
			c.emitEach(EventLeft, batch)
			continue
		}
		kept := c.leave(batch, lost)
		st.m.add(cLeaseLost, len(lost))
		if kind == EventReleased {
			st.m.add(cReleased, len(kept))
		}
		c.emitEach(kind, kept)
	}
}

// deadLetter copies the entry with the reason to the dead-letter stream, then
// acknowledges it. When the copy fails the entry stays pending: it is claimed
// again after its lease and dead-lettered then.
func (c *Consumer) deadLetter(d *delivery, reason string, cause error) {
	values := make(map[string]any, len(d.msg.Values)+8)
	for k, v := range d.msg.Values {
		values[k] = v
	}
	values[DeadFieldReason] = reason
	values[DeadFieldError] = c.errText(cause)
	values[DeadFieldStream] = d.st.name
	values[DeadFieldID] = d.msg.ID
	values[DeadFieldGroup] = c.cfg.Group
	values[DeadFieldConsumer] = c.cfg.Consumer
	values[DeadFieldDeliveries] = d.msg.Deliveries
	values[DeadFieldAt] = time.Now().UTC().Format(time.RFC3339Nano)
	ctx, cancel := context.WithTimeout(c.bgCtx, 5*time.Second)
	defer cancel()
	err := c.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: d.st.dead, MaxLen: c.cfg.DeadLetterMaxLen, Approx: true, Values: values,
	}).Err()
	if err != nil {
		c.log.Error().Err(err).Str("stream", d.st.name).Str("msg_id", d.msg.ID).
			Msg("dead-letter write failed: entry stays pending and will be retried")
		c.forget(d)
		c.emit(EventLeft, d.st.name, d.msg.ID)
		return
	}
	d.st.m.deadLetter(reason)
	c.emit(EventDeadLettered, d.st.name, d.msg.ID)
	c.log.Warn().Str("stream", d.st.name).Str("msg_id", d.msg.ID).Str("reason", reason).
		Str("dead_stream", d.st.dead).Msg("entry dead-lettered")
	c.enqueueAck(d)
}

// maxQueuedAcks bounds the ack queue per handler slot; past it, settling
// handlers wait (backpressure while Redis does not take acks).
const maxQueuedAcks = 64

// enqueueAck hands the entry to the ack loop, waiting while the queue is
// full. At the end of Run the entry is left pending instead: it is
// redelivered after its lease.
func (c *Consumer) enqueueAck(d *delivery) {
	if !c.acks.push(c.bgCtx, d, maxQueuedAcks*(c.cfg.Concurrency+c.cfg.Prefetch)) {
		c.forget(d)
		c.emit(EventLeft, d.st.name, d.msg.ID)
	}
}

// runFenced runs a fenced script on one stream and returns the ids this
// consumer no longer owns.
func runFenced(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, stream string, args []any) ([]string, error) {
	res, err := s.Run(ctx, rdb, []string{stream}, args...).Result()
	if err != nil {
		return nil, err
	}
	items, _ := res.([]any)
	lost := make([]string, 0, len(items))
	for _, it := range items {
		if s, ok := it.(string); ok {
			lost = append(lost, s)
		}
	}
	return lost, nil
}
