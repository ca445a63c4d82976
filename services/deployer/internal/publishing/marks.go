package publishing

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
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
	// flushing holds one write of marks at a time, so that a flush that
	// finds no marks left still returns only once the write that took them
	// is done (the republisher's pass relies on it, see Run).
	flushing sync.Mutex

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
	m.flushing.Lock()
	defer m.flushing.Unlock()
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
