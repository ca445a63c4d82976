// Package publishing puts the deployer's submitted deployments on the
// request queue (ansible:deploy:queue): the group committer stores and
// publishes submits in groups, the publish marker records in batches that
// they were published, and the republisher publishes stored deployments
// that never were (on pkg/outbox's store-then-publish loop). It implements
// deployments.Publisher; the deployments' model and store stay in the
// package deployments.
package publishing

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Config configures a Publisher.
type Config struct {
	// Queue is the request queue. Default ansible:deploy:queue.
	Queue string
	// Tracing makes the republisher's producer spans (package tracing);
	// nil: none. The submit's span is the deployments service's.
	Tracing trace.TracerProvider
}

// Publisher stores and publishes submitted deployments (see the package
// comment); it remembers the job ids it published lately (Owns), which
// the queue observer skips.
type Publisher struct {
	db       *pgxpool.Pool
	producer *stream.Producer
	cfg      Config
	log      zerolog.Logger
	marker   *publishMarker
	metrics  *metrics
	own      *recentSet // job ids this replica published lately (the observer skips them)
	// committer stores and publishes submits without an Idempotency-Key in
	// groups.
	committer *committer
}

var _ deployments.Publisher = (*Publisher)(nil)

// New returns a Publisher; its metrics are registered with reg (nil:
// none).
func New(db *pgxpool.Pool, producer *stream.Producer, cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Publisher, error) {
	if cfg.Queue == "" {
		cfg.Queue = messages.StreamAnsibleDeployQueue
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Publisher{db: db, producer: producer, cfg: cfg, log: log.With().Str("component", "deployments").Logger(),
		metrics: m, own: newRecentSet(100_000)}
	p.marker = newPublishMarker(db, p.log)
	p.committer = newCommitter(p)
	return p, nil
}

// Commit stores row and publishes data with the next commit group and
// waits until that is done (see committer.commit); the error is the
// store's, and the entry id "" when publishing failed.
func (p *Publisher) Commit(row *deployments.Row, data []byte) (string, error) {
	it := &commitItem{row: row, data: data}
	err := p.committer.commit(it)
	return it.entry, err
}

// Owns reports whether this replica published the request of jobID
// lately (it is stored already): the queue observer skips it.
func (p *Publisher) Owns(jobID string) bool { return p.own.has(jobID) }

// PublishStored appends the request of a submit with an Idempotency-Key
// to the queue and returns its entry id, recorded on the deployment before
// it returns, so that a replay of the key shows the same request_id as
// the first answer. A failure is logged, not returned (""): the
// deployment is stored, and the republisher publishes it once Redis
// answers again.
func (p *Publisher) PublishStored(ctx context.Context, id string, msg *messages.AnsibleDeployMessage) string {
	data, err := messages.Encode(msg)
	if err != nil {
		p.log.Error().Err(err).Str("deployment_id", id).Msg("encode deployment request")
		return ""
	}
	return p.PublishStoredTo(ctx, id, p.cfg.Queue, data)
}

// PublishStoredTo is PublishStored of the encoded request data to queue
// (an Ansible job's pool).
func (p *Publisher) PublishStoredTo(ctx context.Context, id, queue string, data []byte) string {
	p.own.add(id) // stored: the observer skips it, even if it reads the entry before Publish returns
	ctx = context.WithoutCancel(ctx)
	entry, err := p.producer.Publish(ctx, queue, data)
	if err != nil {
		p.metrics.publishFailures.Inc()
		p.log.Warn().Err(err).Str("deployment_id", id).Msg("publish deployment: will be retried by the republisher")
		return ""
	}
	if _, err := p.db.Exec(ctx, markDeployments, []string{id}, []string{entry}); err != nil {
		p.log.Warn().Err(err).Str("deployment_id", id).Msg("mark deployment published: left to the marker")
		p.marker.mark(id, entry)
	}
	return entry
}

// PublishStoredBatch is PublishStoredTo of the stored requests ids (data
// in order) in one round trip to Redis and one mark: their entry ids,
// all "" when publishing failed (logged; the republisher publishes them).
func (p *Publisher) PublishStoredBatch(ctx context.Context, ids []string, queue string, data [][]byte) []string {
	entries := make([]string, len(ids))
	if len(ids) == 0 {
		return entries
	}
	for _, id := range ids {
		p.own.add(id)
	}
	ctx = context.WithoutCancel(ctx)
	published, err := p.producer.PublishBatch(ctx, queue, data)
	if err != nil {
		p.metrics.publishFailures.Add(float64(len(ids)))
		p.log.Warn().Err(err).Int("deployments", len(ids)).Msg("publish deployments: will be retried by the republisher")
		return entries
	}
	if _, err := p.db.Exec(ctx, markDeployments, ids, published); err != nil {
		p.log.Warn().Err(err).Int("deployments", len(ids)).Msg("mark deployments published: left to the marker")
		for i, id := range ids {
			p.marker.mark(id, published[i])
		}
	}
	return published
}

type metrics struct {
	publishFailures prometheus.Counter
	commitGroup     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		publishFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "autoprov_deployer_publish_failures_total",
			Help: "Requests whose publication failed at submit (the republisher publishes them later).",
		}),
		commitGroup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "autoprov_deployer_submit_group_size",
			Help:    "Submits stored with one commit and published with one round trip (group commit under load).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.publishFailures, m.commitGroup} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return m, nil
}
