package reconcile

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// Publisher appends entries to a stream in one round trip
// (stream.Producer).
type Publisher interface {
	PublishBatch(ctx context.Context, stream string, data [][]byte) ([]string, error)
}

// RelayConfig configures a Relay. Zero values take the defaults.
type RelayConfig struct {
	// Batch is the most entries published per round (default 500).
	Batch int
	// Interval is how often the outbox is polled when nothing wakes the
	// relay (default 1s).
	Interval time.Duration
	// Retention is how long published entries are kept (default 7 days).
	Retention time.Duration
	Logger    zerolog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Tracing makes a producer span per request published, whose context
	// the request carries (package tracing); nil: none.
	Tracing trace.TracerProvider
}

// Relay publishes the outbox to Redis (fleet.Relay) until it is empty, then
// waits for a wake-up or the poll interval. Every replica may run one: rows
// are claimed with SKIP LOCKED.
type Relay struct {
	fleet *fleet.Store
	pub   Publisher
	cfg   RelayConfig
	log   zerolog.Logger
	wake  chan struct{}

	published prometheus.Counter
	backlog   prometheus.Gauge
	age       prometheus.Gauge
}

// NewRelay returns a Relay publishing through pub.
func NewRelay(f *fleet.Store, pub Publisher, cfg RelayConfig) *Relay {
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	r := &Relay{fleet: f, pub: pub, cfg: cfg, log: cfg.Logger.With().Str("component", "relay").Logger(),
		wake: make(chan struct{}, 1),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "autoprov_scheduler_outbox_published_total", Help: "Outbox entries published to Redis.",
		}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_outbox_backlog", Help: "Outbox entries waiting to be published.",
		}),
		age: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_outbox_oldest_seconds", Help: "Age of the oldest unpublished outbox entry.",
		}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.published, r.backlog, r.age)
	}
	return r
}

// Wake returns the channel that makes the relay look at once.
func (r *Relay) Wake() chan<- struct{} { return r.wake }

// publish publishes entries stream by stream, keeping their order.
func (r *Relay) publish(ctx context.Context, entries []fleet.OutboxEntry) ([]string, error) {
	ids := make([]string, len(entries))
	byStream := map[string][]int{}
	var order []string
	for i, e := range entries {
		if _, ok := byStream[e.Stream]; !ok {
			order = append(order, e.Stream)
		}
		byStream[e.Stream] = append(byStream[e.Stream], i)
	}
	for _, s := range order {
		idx := byStream[s]
		data := make([][]byte, len(idx))
		spans := make([]trace.Span, 0, len(idx))
		for j, i := range idx {
			var span trace.Span
			data[j], span = r.traced(ctx, s, entries[i].Payload)
			if span != nil {
				spans = append(spans, span)
			}
		}
		got, err := r.pub.PublishBatch(ctx, s, data)
		for _, span := range spans {
			tracing.End(span, err)
		}
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			ids[i] = got[j]
		}
	}
	return ids, nil
}

// traced starts the producer span of a request about to be published and
// returns the request carrying its context. Without tracing (or for a
// payload that is not a ProvisionerMessage) it returns payload as it is
// and no span.
func (r *Relay) traced(ctx context.Context, stream string, payload []byte) ([]byte, trace.Span) {
	if r.cfg.Tracing == nil || stream != messages.StreamProvisionerQueue {
		return payload, nil
	}
	sctx, span := tracing.StartPublish(ctx, r.cfg.Tracing, stream)
	if !span.IsRecording() {
		span.End()
		return payload, nil
	}
	m, err := messages.DecodeProvisionerMessage(payload)
	if err != nil {
		span.End()
		return payload, nil
	}
	span.SetAttributes(attribute.String("autoprov.job_id", m.JobID), attribute.String("autoprov.server", m.ServerHandle))
	m.TraceContext = tracing.Inject(sctx)
	data, err := messages.Encode(m)
	if err != nil {
		span.End()
		return payload, nil
	}
	return data, span
}

// Drain publishes until the outbox is empty and returns how many entries
// it published.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := r.fleet.Relay(ctx, r.cfg.Batch, "relay", r.publish)
		total += n
		r.published.Add(float64(n))
		if err != nil {
			return total, err
		}
		if n < r.cfg.Batch {
			return total, nil
		}
	}
}

// Run relays until ctx is done.
func (r *Relay) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	lastPrune := time.Time{}
	failing := false
	for {
		n, err := r.Drain(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				r.log.Error().Err(err).Msg("relay failed: the outbox keeps the messages, retrying")
			}
			failing = true
		case err == nil:
			if failing {
				r.log.Info().Msg("relay recovered")
			}
			failing = false
			if n > 0 {
				r.log.Debug().Int("published", n).Msg("outbox relayed")
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if backlog, age, err := r.fleet.OutboxBacklog(ctx); err == nil {
			r.backlog.Set(float64(backlog))
			r.age.Set(age.Seconds())
		}
		if time.Since(lastPrune) > time.Hour {
			if _, err := r.fleet.PruneOutbox(ctx, r.cfg.Retention); err == nil {
				lastPrune = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-t.C:
		}
	}
}
