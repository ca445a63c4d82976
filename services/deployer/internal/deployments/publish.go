package deployments

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/outbox"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// publishMarker records, in batches, that deployments were published (and
// their entry ids), so that a submit costs one transaction, not two. A
// commit group is marked with one row (deployment_publish_groups: the
// entry id of each position), not by updating each of its deployments; a
// deployment published on its own (by the republisher, or a submit with
// an Idempotency-Key) gets request_id and published_at on its row. A mark
// lost in a crash only means the republisher publishes the request again,
// which the job id makes harmless. For the same reason a write of marks
// does not wait for its commit to reach the disk (synchronous_commit off
// for that transaction only), and writes are at least markInterval apart,
// so that under load many groups share one: each commit costs Postgres as
// much as storing a few more rows.
type publishMarker struct {
	db  *pgxpool.Pool
	log zerolog.Logger

	mu      sync.Mutex
	ids     []string // deployments published on their own
	entries []string
	groups  []string // commit groups published
	// groupEntries holds each group's entry ids by position, joined with
	// commas (entry ids never hold one).
	groupEntries []string
	kick         chan struct{}
}

func newPublishMarker(db *pgxpool.Pool, log zerolog.Logger) *publishMarker {
	return &publishMarker{db: db, log: log, kick: make(chan struct{}, 1)}
}

// mark records that deployment id was published as entry.
func (m *publishMarker) mark(id, entry string) {
	m.mu.Lock()
	m.ids = append(m.ids, id)
	m.entries = append(m.entries, entry)
	m.mu.Unlock()
	m.wake()
}

// markGroup records that the deployments of commit group id were
// published as entries (by position from 1; "" where none was stored).
func (m *publishMarker) markGroup(id string, entries []string) {
	m.mu.Lock()
	m.groups = append(m.groups, id)
	m.groupEntries = append(m.groupEntries, strings.Join(entries, ","))
	m.mu.Unlock()
	m.wake()
}

func (m *publishMarker) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// run writes the marks until ctx is done, then writes what is left. A
// write is never cut short by ctx (flush bounds it): marks taken for a
// write that failed would be lost.
func (m *publishMarker) run(ctx context.Context) {
	defer m.flush(context.WithoutCancel(ctx)) // what is left once ctx is done
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		}
		m.flush(context.WithoutCancel(ctx))
		// Let the marks of the next moment gather.
		if clock.Sleep(ctx, nil, markInterval) != nil {
			return
		}
	}
}

// markInterval is the least time between two writes of marks.
const markInterval = 50 * time.Millisecond

// markDeployments and markGroups write the two kinds of marks.
const (
	markDeployments = `
		UPDATE deployments d SET request_id = v.entry, published_at = now()
		FROM (SELECT unnest($1::uuid[]) AS id, unnest($2::text[]) AS entry) v
		WHERE d.id = v.id AND d.published_at IS NULL`
	markGroups = `
		INSERT INTO deployment_publish_groups (id, entries)
		SELECT g.id, string_to_array(g.entries, ',') FROM unnest($1::uuid[], $2::text[]) AS g(id, entries)
		ON CONFLICT (id) DO NOTHING`
)

func (m *publishMarker) flush(ctx context.Context) {
	m.mu.Lock()
	ids, entries, groups, groupEntries := m.ids, m.entries, m.groups, m.groupEntries
	m.ids, m.entries, m.groups, m.groupEntries = nil, nil, nil, nil
	m.mu.Unlock()
	if len(ids) == 0 && len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// One round trip, one transaction that does not wait for its WAL flush.
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL synchronous_commit TO off`)
	if len(ids) > 0 {
		b.Queue(markDeployments, ids, entries)
	}
	if len(groups) > 0 {
		b.Queue(markGroups, groups, groupEntries)
	}
	b.Queue(`COMMIT`)
	if err := m.db.SendBatch(ctx, b).Close(); err != nil {
		m.log.Warn().Err(err).Int("deployments", len(ids)).Int("groups", len(groups)).
			Msg("record published deployments (the republisher will publish them again)")
	}
}

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
func (s *Service) Run(ctx context.Context, cfg RepublisherConfig) error {
	if cfg.After <= 0 {
		cfg.After = time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 15 * time.Second
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.marker.run(ctx) })
	defer wg.Wait()
	pass := outbox.RelayFunc(func(ctx context.Context, limit int) (int, error) {
		n, err := s.republishBatch(ctx, cfg.After, limit)
		if n > 0 {
			// The marks are written before the next pass looks again, so
			// that it does not publish these a second time.
			s.marker.flush(context.WithoutCancel(ctx))
			s.log.Info().Int("deployments", n).Msg("republished deployments that were not published")
		}
		return n, err
	})
	return outbox.Run(ctx, pass, outbox.Config{Name: "republisher", Batch: republishBatchSize, Interval: cfg.Interval,
		Logger: s.log.With().Str("component", "republisher").Logger()})
}

// republishBatchSize is the most deployments a pass of the republisher
// publishes.
const republishBatchSize = 500

// republish publishes up to republishBatchSize stored deployments older
// than after that were never published, and hands their marks to the
// marker.
func (s *Service) republish(ctx context.Context, after time.Duration) (int, error) {
	return s.republishBatch(ctx, after, republishBatchSize)
}

func (s *Service) republishBatch(ctx context.Context, after time.Duration, limit int) (int, error) {
	rows, err := s.db.Query(ctx, selectDeployment+`
		WHERE d.published_at IS NULL AND d.source = 'api' AND d.status = 'queued' AND d.created_at < now() - $1::interval
			AND g.id IS NULL
		ORDER BY d.created_at LIMIT $2`, after, limit)
	if err != nil {
		return 0, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Deployment, error) { return scanDeployment(r) })
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range items {
		msg := deployMessage(&d.Request, d.JobID, d.CreatedAt)
		s.own.add(d.JobID) // stored: the observer skips it
		entry, err := s.republishOne(ctx, d.ID, msg)
		if err != nil {
			return n, err
		}
		s.marker.mark(d.ID, entry)
		n++
	}
	return n, nil
}

// deployMessage is the queue request of deployment jobID, asked for with
// r at at. It is the one builder of the request: the submit path builds
// it from the client's request (then normalised by toMessage, and stored
// as normalised), the republisher from the stored deployment, so that a
// republished request is the submitted one, apart from its trace context.
func deployMessage(r *Request, jobID string, at time.Time) *messages.AnsibleDeployMessage {
	return &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{
			SchemaVersion: messages.SchemaVersion, JobID: jobID, CorrelationID: r.CorrelationID,
			CreatedAt: messages.FormatTime(at),
		},
		ProjectID: r.ProjectID, RepoFullName: r.RepoFullName, Branch: r.Branch, ServerIP: r.ServerIP,
		Port: r.Port, Modules: r.Modules, GitHubTokenRef: r.GitHubTokenRef, SecretsRef: r.SecretsRef,
		TimeoutSeconds: r.Options.TimeoutSeconds,
	}
}

// republishOne publishes a stored deployment's request inside a producer
// span whose context the request carries, so infra's job span joins it.
// The submit's own trace is not stored with the deployment: the span
// starts a trace of its own, marked autoprov.republished.
func (s *Service) republishOne(ctx context.Context, id string, msg *messages.AnsibleDeployMessage) (string, error) {
	sctx, span := tracing.StartPublish(ctx, s.cfg.Tracing, s.cfg.Streams.Queue,
		attribute.String("autoprov.deployment_id", id), attribute.String("autoprov.job_id", msg.JobID),
		attribute.Bool("autoprov.republished", true))
	msg.TraceContext = tracing.Inject(sctx)
	data, err := messages.Encode(msg)
	if err != nil {
		tracing.End(span, err)
		return "", err
	}
	entry, err := s.producer.Publish(sctx, s.cfg.Streams.Queue, data)
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
