package deployments_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/publishing"
)

// newKeyedService returns a Service publishing through the package
// publishing, on db (nil: a fresh database) and real Redis, that keeps
// Idempotency-Keys for ttl (0: as long as their deployments).
func newKeyedService(t *testing.T, ttl time.Duration, db *pgxpool.Pool) (*deployments.Service, *pgxpool.Pool) {
	t.Helper()
	if db == nil {
		db = testenv.Pool(t)
	}
	rdb := testenv.Redis(t)
	streams := deployments.Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-")}
	p, err := publishing.New(db, stream.NewProducer(rdb, stream.ProducerOptions{}), publishing.Config{Queue: streams.Queue}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := deployments.New(db, stream.NewJobs(rdb), p, deployments.NewNotifier(rdb, testenv.Unique("n-"), zerolog.Nop()),
		deployments.Config{Streams: streams, IdempotencyTTL: ttl}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// apiKey stores an API key and returns its id.
func apiKey(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	k, _, err := auth.NewStore(db).Create(context.Background(), auth.NewKey{Name: "prune", Scopes: []auth.Scope{auth.ScopeDeploymentsWrite}, FleetWide: true})
	if err != nil {
		t.Fatal(err)
	}
	return k.ID
}

// TestIdempotencyKeyTTL: an Idempotency-Key remembered longer than the
// service's IdempotencyTTL counts as unused (a retry makes a new
// deployment, another request with it is no mismatch), Prune deletes such
// keys, and without a TTL a key stays as long as its deployment.
func TestIdempotencyKeyTTL(t *testing.T) {
	t.Parallel()
	s, db := newKeyedService(t, time.Hour, nil)
	ctx := context.Background()
	keyID := apiKey(t, db)
	r := deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	age := func(key string, by time.Duration) {
		t.Helper()
		if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - $2::interval WHERE key = $1`, key, by); err != nil {
			t.Fatal(err)
		}
	}

	first, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "retry-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "retry-1")
	if err != nil || !again.Replayed || again.Deployment.ID != first.Deployment.ID {
		t.Fatalf("retry within the TTL: %+v, %v; want the first deployment replayed", again, err)
	}
	age("retry-1", 2*time.Hour)
	later, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "retry-1")
	if err != nil || later.Replayed || later.Deployment.ID == first.Deployment.ID {
		t.Fatalf("retry after the TTL: %+v, %v; want a new deployment", later, err)
	}
	if again, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "retry-1"); err != nil || !again.Replayed || again.Deployment.ID != later.Deployment.ID {
		t.Fatalf("retry of the renewed key: %+v, %v; want the new deployment replayed", again, err)
	}
	other := r
	other.Branch = "release"
	age("retry-1", 2*time.Hour)
	if sub, err := s.Submit(ctx, keyID, deployments.AllProjects, other, "retry-1"); err != nil || sub.Replayed {
		t.Fatalf("another request with an expired key: %+v, %v; want a new deployment", sub, err)
	}

	if _, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "fresh"); err != nil {
		t.Fatal(err)
	}
	age("retry-1", 2*time.Hour)
	if got, err := s.Prune(ctx, 0); err != nil || got != (deployments.Pruned{IdempotencyKeys: 1}) {
		t.Errorf("prune: %+v, %v; want the expired key deleted", got, err)
	}
	rows, err := db.Query(ctx, `SELECT key FROM idempotency_keys`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "fresh" {
		t.Errorf("keys left %v, want [fresh]", keys)
	}

	// No TTL: an old key is still honoured and not pruned.
	s, _ = newKeyedService(t, 0, db)
	age("fresh", 1000*time.Hour)
	if sub, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "fresh"); err != nil || !sub.Replayed {
		t.Errorf("old key without a TTL: %+v, %v; want a replay", sub, err)
	}
	if got, err := s.Prune(ctx, 0); err != nil || got != (deployments.Pruned{}) {
		t.Errorf("prune without a TTL: %+v, %v; want nothing", got, err)
	}
}

// TestPruneKeepsRenewedIdempotencyKey: a key that Submit renews while the
// prune waits for its row is kept (the prune re-checks the new version).
func TestPruneKeepsRenewedIdempotencyKey(t *testing.T) {
	t.Parallel()
	s, db := newKeyedService(t, time.Hour, nil)
	ctx := context.Background()
	keyID := apiKey(t, db)
	r := deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	if _, err := s.Submit(ctx, keyID, deployments.AllProjects, r, "renewed"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	// A renewal in flight: the row is locked until it commits.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() WHERE key = 'renewed'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan deployments.Pruned, 1)
	go func() {
		got, err := s.Prune(ctx, 0)
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	testenv.WaitFor(t, 30*time.Second, "the prune to wait for the renewed key's row", func() bool {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM idempotency_keys%')`).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got.IdempotencyKeys != 0 {
		t.Errorf("prune deleted %d keys, want the renewed one kept", got.IdempotencyKeys)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'renewed'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("renewed key rows %d (%v), want 1", n, err)
	}
}
