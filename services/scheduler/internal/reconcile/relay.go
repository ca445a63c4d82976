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
	"github.com/autoprovisioner/autoprovisioner/pkg/outbox"
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
// waits for a wake-up or the poll interval (the loop of pkg/outbox, which
// the deployer's republisher shares). Every replica may run one: rows are
// claimed with SKIP LOCKED.
type Relay struct {
	fleet *fleet.Store
	pub   Publisher
	cfg   RelayConfig
	log   zerolog.Logger
	wake  chan struct{}
	// lastPrune is when Run last pruned the outbox (only Run's loop uses it).
	lastPrune time.Time

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

// loop is the shared store-then-publish loop's configuration of r.
func (r *Relay) loop() outbox.Config {
	return outbox.Config{
		Name: "relay", Batch: r.cfg.Batch, Interval: r.cfg.Interval, Wake: r.wake, Logger: r.log,
		Published:  func(n int) { r.published.Add(float64(n)) },
		AfterDrain: r.afterDrain,
	}
}

// relayBatch is one pass: fleet.Relay claims, publishes and marks up to
// limit outbox entries in one transaction.
func (r *Relay) relayBatch(ctx context.Context, limit int) (int, error) {
	return r.fleet.Relay(ctx, limit, "relay", r.publish)
}

// Drain publishes until the outbox is empty and returns how many entries
// it published.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	return outbox.Drain(ctx, outbox.RelayFunc(r.relayBatch), r.loop())
}

// Run relays until ctx is done (pkg/outbox runs the loop).
func (r *Relay) Run(ctx context.Context) error {
	return outbox.Run(ctx, outbox.RelayFunc(r.relayBatch), r.loop())
}

// afterDrain updates the backlog metrics and prunes published entries at
// most once an hour.
func (r *Relay) afterDrain(ctx context.Context) {
	if backlog, age, err := r.fleet.OutboxBacklog(ctx); err == nil {
		r.backlog.Set(float64(backlog))
		r.age.Set(age.Seconds())
	}
	if time.Since(r.lastPrune) > time.Hour {
		if _, err := r.fleet.PruneOutbox(ctx, r.cfg.Retention); err == nil {
			r.lastPrune = time.Now()
		}
	}
}
