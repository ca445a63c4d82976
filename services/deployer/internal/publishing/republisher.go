package publishing

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/outbox"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// RepublisherConfig configures the republisher.
type RepublisherConfig struct {
	// After is how long a deployment may stay unpublished before it is
	// published again. Default 1m.
	After time.Duration
	// Interval is how often it looks. Default 15s.
	Interval time.Duration
}

// Run runs the publish marker and the republisher until ctx is done. The
// republisher publishes stored deployments that were never marked
// published (Redis was down at submit, or the process died right after
// storing one), in passes of the store-then-publish loop the scheduler's
// outbox relay shares (pkg/outbox).
func (p *Publisher) Run(ctx context.Context, cfg RepublisherConfig) error {
	if cfg.After <= 0 {
		cfg.After = time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 15 * time.Second
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.marker.run(ctx) })
	defer wg.Wait()
	pass := outbox.RelayFunc(func(ctx context.Context, limit int) (int, error) {
		n, err := p.republishBatch(ctx, cfg.After, limit)
		if n > 0 {
			// The marks are written before the next pass looks again, so
			// that it does not publish these a second time.
			p.marker.flush(context.WithoutCancel(ctx))
			p.log.Info().Int("deployments", n).Msg("republished deployments that were not published")
		}
		return n, err
	})
	return outbox.Run(ctx, pass, outbox.Config{Name: "republisher", Batch: republishBatchSize, Interval: cfg.Interval,
		Logger: p.log.With().Str("component", "republisher").Logger()})
}

// republishBatchSize is the most deployments a pass of the republisher
// publishes.
const republishBatchSize = 500

// republish publishes up to republishBatchSize stored deployments older
// than after that were never published, and hands their marks to the
// marker.
func (p *Publisher) republish(ctx context.Context, after time.Duration) (int, error) {
	return p.republishBatch(ctx, after, republishBatchSize)
}

func (p *Publisher) republishBatch(ctx context.Context, after time.Duration, limit int) (int, error) {
	items, err := deployments.Unpublished(ctx, p.db, after, limit)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range items {
		p.own.add(d.JobID) // stored: the observer skips it
		var entry string
		var err error
		if d.Kind == deployments.KindJob && d.Job != nil {
			msg := deployments.JobMessage(d.Job, d.JobID, d.CreatedAt)
			entry, err = p.republishOne(ctx, d.ID, d.JobID, d.Queue(), func(tc messages.TraceContext) ([]byte, error) {
				msg.TraceContext = tc
				return messages.Encode(msg)
			})
		} else {
			msg := deployments.DeployMessage(&d.Request, d.JobID, d.CreatedAt)
			entry, err = p.republishOne(ctx, d.ID, d.JobID, p.cfg.Queue, func(tc messages.TraceContext) ([]byte, error) {
				msg.TraceContext = tc
				return messages.Encode(msg)
			})
		}
		if err != nil {
			return n, err
		}
		p.marker.mark(d.ID, entry)
		n++
	}
	return n, nil
}

// republishOne publishes a stored deployment's request inside a producer
// span whose context the request carries, so infra's job span joins it.
// The submit's own trace is not stored with the deployment: the span
// starts a trace of its own, marked autoprov.republished.
func (p *Publisher) republishOne(ctx context.Context, id, jobID, queue string, encode func(messages.TraceContext) ([]byte, error)) (string, error) {
	sctx, span := tracing.StartPublish(ctx, p.cfg.Tracing, queue,
		attribute.String("autoprov.deployment_id", id), attribute.String("autoprov.job_id", jobID),
		attribute.Bool("autoprov.republished", true))
	data, err := encode(tracing.Inject(sctx))
	if err != nil {
		tracing.End(span, err)
		return "", err
	}
	entry, err := p.producer.Publish(sctx, queue, data)
	tracing.End(span, err)
	return entry, err
}

// recentSet remembers the last n strings added.
type recentSet struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

func newRecentSet(n int) *recentSet {
	return &recentSet{set: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (r *recentSet) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = s
	r.set[s] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
}

func (r *recentSet) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.set[s]
	return ok
}
