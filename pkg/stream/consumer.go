package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// releaseIdle is the idle time given to an entry released at shutdown: far
// beyond any lease, yet small enough that Redis accepts it (a delivery time
// before the epoch is silently replaced by "now").
const releaseIdle = 365 * 24 * time.Hour

// Consumer runs a Handler for the entries of its streams as a member of a
// consumer group. Create it with NewConsumer and start it with Run.
type Consumer struct {
	rdb     redis.UniversalClient
	cfg     Config
	handler Handler
	log     zerolog.Logger
	streams []*streamState
	readers [][]*streamState // the streams of each reader (readerStreams)

	slots *slots         // free holds: Concurrency + Prefetch entries in all
	work  chan *delivery // dispatched deliveries, served by Concurrency workers
	acks  *ackQueue      // settled deliveries waiting for XACK

	mu       sync.Mutex
	inflight map[deliveryKey]*delivery
	emptied  chan struct{} // poked when inflight becomes empty

	draining atomic.Bool // shutting down: entries not yet started are released

	handlers sync.WaitGroup  // dispatched and not yet settled
	hctx     context.Context // parent of the handlers' contexts (never cancelled)
	bgCtx    context.Context // lives until the end of Run: heartbeat, acks
	running  atomic.Bool
}

// streamState is the per-stream state of a Consumer.
type streamState struct {
	name   string
	dead   string
	m      *groupMetrics
	cursor string // XAUTOCLAIM cursor

	nextClaim time.Time // when the stream's next claim round is due (its reader's own)
}

type deliveryKey struct{ stream, id string }

// delivery is an entry held by this consumer: its handler runs or its
// acknowledgement is pending.
type delivery struct {
	msg       *Message
	st        *streamState
	ctx       context.Context
	cancel    context.CancelCauseFunc
	overLimit bool      // claimed past the delivery limit: dead-letter without running
	ready     time.Time // when the consumer took its slot (Message.Pickup)
	handOff   *handOffs // where the handler hands its slot (HandOff)

	// Guarded by Consumer.mu.
	renewSent time.Time // local time just before the last command that reset the entry's idle time was sent
	lost      bool      // the entry is no longer ours
}

// NewConsumer validates cfg and returns a consumer that will run h.
func NewConsumer(rdb redis.UniversalClient, cfg Config, h Handler) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("stream consumer config: %w", err)
	}
	c := &Consumer{
		rdb:      rdb,
		cfg:      cfg,
		handler:  h,
		log:      cfg.Logger.With().Str("group", cfg.Group).Str("consumer", cfg.Consumer).Logger(),
		slots:    newSlots(cfg.Concurrency + cfg.Prefetch),
		work:     make(chan *delivery, cfg.Concurrency+cfg.Prefetch),
		acks:     newAckQueue(),
		inflight: make(map[deliveryKey]*delivery),
		emptied:  make(chan struct{}, 1),
	}
	for _, s := range cfg.Streams {
		c.streams = append(c.streams, &streamState{
			name:   s,
			dead:   s + DeadLetterSuffix,
			m:      cfg.Metrics.forGroup(s, cfg.Group),
			cursor: "0-0",
		})
	}
	c.readers = c.readerStreams()
	return c, nil
}

// Name returns the consumer's name in its group.
func (c *Consumer) Name() string { return c.cfg.Consumer }

// Run consumes until ctx is cancelled, then shuts down gracefully (see the
// package documentation) and returns. It returns an error only when it
// cannot start; a consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("stream consumer: Run called twice")
	}
	if err := c.createGroups(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // cancelled before it started: nothing to drain
		}
		return err
	}

	// Handlers and the heartbeat outlive ctx: the drain needs them. The
	// handlers' parent context cannot be cancelled, so that creating and
	// finishing a delivery's context touches no shared lock; shutdown cancels
	// deliveries one by one (cancelAll).
	bgCtx, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	c.bgCtx, c.hctx = bgCtx, context.WithoutCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { c.heartbeatLoop(bgCtx) })
	bg.Go(func() { c.ackLoop(bgCtx) })
	var workers sync.WaitGroup
	for range c.cfg.Concurrency {
		workers.Go(func() {
			for d := range c.work {
				c.process(d)
			}
		})
	}

	c.log.Info().Strs("streams", c.cfg.Streams).Int("concurrency", c.cfg.Concurrency).
		Int("prefetch", c.cfg.Prefetch).Dur("lease", c.cfg.Lease).Msg("consumer started")

	var readers sync.WaitGroup
	for _, sts := range c.readers {
		readers.Go(func() { c.readLoop(ctx, sts) })
	}
	readers.Go(func() { c.maintainLoop(ctx) })

	<-ctx.Done()
	// Shutdown order: stop taking new entries first, so nothing new starts,
	// and give back the prefetched ones no handler started; then let
	// handlers finish while the heartbeat keeps their leases; then cancel
	// the stragglers and release their entries; last, flush acks and stop
	// the heartbeat.
	c.draining.Store(true)
	readers.Wait()
	c.releaseWaiting()
	c.log.Info().Int("in_flight", c.inFlight()).Dur("grace", c.cfg.ShutdownGrace).Msg("consumer draining")
	settled := true
	if !waitTimeout(&c.handlers, c.cfg.ShutdownGrace) {
		c.log.Warn().Int("in_flight", c.inFlight()).Msg("shutdown grace over: cancelling handlers")
		c.cancelAll(ErrShutdown)
		if settled = waitTimeout(&c.handlers, c.cfg.CancelGrace); !settled {
			c.log.Error().Int("in_flight", c.inFlight()).
				Msg("handlers ignored cancellation; their entries stay pending until their lease expires")
		}
	}
	close(c.work)
	if settled {
		workers.Wait()
	}
	c.waitAcksFlushed(5 * time.Second)
	bgCancel()
	bg.Wait()
	c.log.Info().Msg("consumer stopped")
	return nil
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// cancelAll cancels the contexts of all in-flight deliveries with cause.
func (c *Consumer) cancelAll(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.inflight {
		d.cancel(cause)
	}
}

func (c *Consumer) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.inflight)
}

// createGroups creates the group on every stream, retrying while Redis is
// unreachable.
func (c *Consumer) createGroups(ctx context.Context) error {
	for _, st := range c.streams {
		err := retry(ctx, c.log, "create group on "+st.name, func() error {
			_, err := c.ensureGroup(ctx, st)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ensureGroup creates the group on st's stream unless it exists; it
// reports whether it created it.
func (c *Consumer) ensureGroup(ctx context.Context, st *streamState) (bool, error) {
	err := c.rdb.XGroupCreateMkStream(ctx, st.name, c.cfg.Group, c.cfg.StartID).Err()
	switch {
	case err == nil:
		return true, nil
	case isBusyGroup(err):
		return false, nil
	}
	return false, fmt.Errorf("xgroup create %s %s: %w", st.name, c.cfg.Group, err)
}

// retry calls f until it succeeds or ctx is done, backing off exponentially.
func retry(ctx context.Context, log zerolog.Logger, what string, f func() error) error {
	bo := newBackoff()
	for {
		err := f()
		if err == nil {
			return nil
		}
		d := bo.NextBackOff()
		log.Warn().Err(err).Dur("retry_in", d).Msg(what + " failed")
		if serr := clock.Sleep(ctx, nil, d); serr != nil {
			return fmt.Errorf("%s: %w", what, errors.Join(err, serr))
		}
	}
}

func newBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 2 * time.Second
	return bo
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) { _ = clock.Sleep(ctx, nil, d) }

// readerStreams splits the streams among the readers: one reader reads
// them all in one XREADGROUP, but on Redis Cluster, where the streams may
// live in different slots (and a command's keys must share one), each
// stream has a reader of its own.
func (c *Consumer) readerStreams() [][]*streamState {
	if _, cluster := c.rdb.(*redis.ClusterClient); !cluster {
		return [][]*streamState{c.streams}
	}
	out := make([][]*streamState, len(c.streams))
	for i, st := range c.streams {
		out[i] = []*streamState{st}
	}
	return out
}

// share is how many slots one reader may take at once: the free slots
// divided among the readers (several only on Redis Cluster), so that a
// reader blocked on a quiet stream does not starve a busy one.
func (c *Consumer) share() int {
	n := (c.slots.available() + len(c.readers) - 1) / len(c.readers)
	return max(n, 1)
}
