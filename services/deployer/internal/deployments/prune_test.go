package deployments

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

// TestPrune applies the retention to a real database: finished deployments
// older than it go with their webhook deliveries, recent and queued ones
// stay, however old; a commit group's publish marks stay while one of its
// deployments is left and go with the last one (also with a refused
// position among its entries); more than one batch is deleted in one call.
func TestPrune(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	const keep = 30 * 24 * time.Hour
	old := 100 * 24 * time.Hour

	// stored inserts rows as one commit group and marks the group
	// published with entries (one per position).
	stored := func(entries []string, rows ...deploymentRow) {
		t.Helper()
		var group []*commitItem
		for _, r := range rows {
			group = append(group, &commitItem{row: r})
		}
		if err := s.committer.insert(ctx, rows[0].id, group); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO deployment_publish_groups (id, entries) VALUES ($1, $2)`, rows[0].id, entries); err != nil {
			t.Fatal(err)
		}
	}
	finish := func(id string, status Status, ago time.Duration) {
		t.Helper()
		if _, err := db.Exec(ctx, `UPDATE deployments SET status = $2, finished_at = $3 WHERE id = $1`, id, string(status), s.now().Add(-ago)); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(table, id string) bool {
		t.Helper()
		var ok bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE id = $1)`, id).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// Group a: two old finished deployments and one old one still queued.
	a := []deploymentRow{testRow(s, "", old), testRow(s, "", old), testRow(s, "", old)}
	stored([]string{"1-1", "1-2", "1-3"}, a...)
	finish(a[0].id, StatusSucceeded, old-time.Hour)
	finish(a[1].id, StatusCancelled, old-time.Hour)
	// Group b: the second position was refused; both stored rows are old
	// and finished.
	b := []deploymentRow{testRow(s, "", old), testRow(s, "", old)}
	stored([]string{"2-1", "", "2-3"}, b...)
	finish(b[0].id, StatusFailed, old-time.Hour)
	finish(b[1].id, StatusRejected, old-time.Hour)
	// Old, but finished within the retention; and recent.
	late := testRow(s, "", old)
	recent := testRow(s, "", time.Hour)
	stored([]string{"3-1", "3-2"}, late, recent)
	finish(late.id, StatusSucceeded, keep-time.Hour)
	finish(recent.id, StatusSucceeded, time.Minute)
	// A webhook delivery of a deleted deployment, with an attempt.
	delivery := uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO webhook_deliveries (id, deployment_id, event, url, body, give_up_at, state)
		VALUES ($1, $2, 'deployment.finished', 'https://hooks.example.org/x', '{}', now(), 'delivered')`, delivery, a[0].id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
		VALUES ($1, 1, now(), 12.5, 200)`, delivery); err != nil {
		t.Fatal(err)
	}
	// More than one batch of old finished deployments published on their
	// own (no group).
	if _, err := db.Exec(ctx, `INSERT INTO deployments (id, job_id, source, status, created_at, finished_at, request_id, published_at)
		SELECT gen_random_uuid(), 'bulk-' || i, 'api', 'succeeded', now() - interval '200 days', now() - interval '199 days', i || '-0', now() - interval '200 days'
		FROM generate_series(1, $1::int) i`, pruneBatch+7); err != nil {
		t.Fatal(err)
	}

	got, err := s.Prune(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Pruned{Deployments: 4 + pruneBatch + 7, Groups: 1}); got != want {
		t.Errorf("first prune deleted %+v, want %+v", got, want)
	}
	for _, c := range []struct {
		table, id string
		kept      bool
	}{
		{"deployments", a[0].id, false}, {"deployments", a[1].id, false}, {"deployments", a[2].id, true},
		{"deployments", b[0].id, false}, {"deployments", b[1].id, false},
		{"deployments", late.id, true}, {"deployments", recent.id, true},
		{"deployment_publish_groups", a[0].id, true}, {"deployment_publish_groups", b[0].id, false},
		{"deployment_publish_groups", late.id, true}, {"webhook_deliveries", delivery, false},
	} {
		if exists(c.table, c.id) != c.kept {
			t.Errorf("%s %s: kept %v, want %v", c.table, c.id, !c.kept, c.kept)
		}
	}
	var attempts int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = $1`, delivery).Scan(&attempts); err != nil || attempts != 0 {
		t.Errorf("%d attempts of a deleted delivery left (%v)", attempts, err)
	}
	// The deployment left in group a still shows the entry its group marked.
	if d, err := s.Get(ctx, a[2].id); err != nil || d.RequestID != "1-3" || d.Status != StatusQueued {
		t.Errorf("queued deployment of a pruned group: %+v, %v", d, err)
	}

	// Group a's last deployment ends long ago: it goes, and its group.
	finish(a[2].id, StatusUnreachable, old-time.Hour)
	if got, err := s.Prune(ctx, keep); err != nil || got != (Pruned{Deployments: 1, Groups: 1}) {
		t.Errorf("second prune: %+v, %v; want one deployment and its group", got, err)
	}
	if exists("deployment_publish_groups", a[0].id) {
		t.Error("group a outlived its last deployment")
	}
	// Retention 0 keeps everything.
	finish(late.id, StatusSucceeded, old)
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{}) {
		t.Errorf("prune with retention 0: %+v, %v; want nothing deleted", got, err)
	}
}

// TestIdempotencyKeyTTL: an Idempotency-Key remembered longer than the
// service's IdempotencyTTL counts as unused (a retry makes a new
// deployment, another request with it is no mismatch), Prune deletes such
// keys, and without a TTL a key stays as long as its deployment.
func TestIdempotencyKeyTTL(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	s.cfg.IdempotencyTTL = time.Hour
	ctx := context.Background()
	keyID := apiKey(t, db)
	r := Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	age := func(key string, by time.Duration) {
		t.Helper()
		if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - $2::interval WHERE key = $1`, key, by); err != nil {
			t.Fatal(err)
		}
	}

	first, err := s.Submit(ctx, keyID, AllProjects, r, "retry-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Submit(ctx, keyID, AllProjects, r, "retry-1")
	if err != nil || !again.Replayed || again.Deployment.ID != first.Deployment.ID {
		t.Fatalf("retry within the TTL: %+v, %v; want the first deployment replayed", again, err)
	}
	age("retry-1", 2*time.Hour)
	later, err := s.Submit(ctx, keyID, AllProjects, r, "retry-1")
	if err != nil || later.Replayed || later.Deployment.ID == first.Deployment.ID {
		t.Fatalf("retry after the TTL: %+v, %v; want a new deployment", later, err)
	}
	if again, err := s.Submit(ctx, keyID, AllProjects, r, "retry-1"); err != nil || !again.Replayed || again.Deployment.ID != later.Deployment.ID {
		t.Fatalf("retry of the renewed key: %+v, %v; want the new deployment replayed", again, err)
	}
	other := r
	other.Branch = "release"
	age("retry-1", 2*time.Hour)
	if sub, err := s.Submit(ctx, keyID, AllProjects, other, "retry-1"); err != nil || sub.Replayed {
		t.Fatalf("another request with an expired key: %+v, %v; want a new deployment", sub, err)
	}

	if _, err := s.Submit(ctx, keyID, AllProjects, r, "fresh"); err != nil {
		t.Fatal(err)
	}
	age("retry-1", 2*time.Hour)
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{IdempotencyKeys: 1}) {
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
	s.cfg.IdempotencyTTL = 0
	age("fresh", 1000*time.Hour)
	if sub, err := s.Submit(ctx, keyID, AllProjects, r, "fresh"); err != nil || !sub.Replayed {
		t.Errorf("old key without a TTL: %+v, %v; want a replay", sub, err)
	}
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{}) {
		t.Errorf("prune without a TTL: %+v, %v; want nothing", got, err)
	}
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

// pairGroups stores n commit groups of two finished deployments, published
// as groups: the first of each finished first ago, the second second ago
// (each a few seconds earlier than the one before, each created a day
// before it finished).
func pairGroups(t *testing.T, db *pgxpool.Pool, n int, first, second time.Duration) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
		WITH g AS (SELECT gen_random_uuid() AS id, i FROM generate_series(1, $1::int) i),
		marks AS (INSERT INTO deployment_publish_groups (id, entries) SELECT id, ARRAY[i || '-1', i || '-2'] FROM g),
		d AS (SELECT g.id, g.i, p, now() - (CASE p WHEN 1 THEN $2 ELSE $3 END)::interval - (g.i * 2 + p) * interval '1 second' AS finished
			FROM g, generate_series(1, 2) p)
		INSERT INTO deployments (id, job_id, source, status, created_at, finished_at, publish_group, publish_pos)
		SELECT gen_random_uuid(), 'g-' || i || '-' || p, 'api', 'succeeded', finished - interval '1 day', finished, id, p
		FROM d`, n, first, second); err != nil {
		t.Fatal(err)
	}
}

// TestPruneConcurrently: replicas pruning at the same moment (each with
// its own clock, so slightly different cutoffs) delete every old finished
// deployment once and leave no publish marks of an emptied group behind.
func TestPruneConcurrently(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	const groups = 1500
	// Both members of each group finished long ago.
	pairGroups(t, db, groups, 99*24*time.Hour, 99*24*time.Hour)
	var wg sync.WaitGroup
	var total Pruned
	var mu sync.Mutex
	for i := range 4 {
		wg.Go(func() {
			got, err := s.Prune(ctx, 30*24*time.Hour+time.Duration(i)*1001*time.Second)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total.Deployments, total.Groups = total.Deployments+got.Deployments, total.Groups+got.Groups
			mu.Unlock()
		})
	}
	wg.Wait()
	got, err := s.Prune(ctx, 30*24*time.Hour) // what a replica that skipped finds an hour later
	if err != nil {
		t.Fatal(err)
	}
	total.Deployments, total.Groups = total.Deployments+got.Deployments, total.Groups+got.Groups
	var left, marks int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM deployments), (SELECT count(*) FROM deployment_publish_groups)`).Scan(&left, &marks); err != nil {
		t.Fatal(err)
	}
	if left != 0 || marks != 0 || total.Deployments != 2*groups || total.Groups != groups {
		t.Errorf("after concurrent prunes: %d deployments and %d group marks left, %+v deleted; want none left, %d and %d deleted",
			left, marks, total, 2*groups, groups)
	}
}

// TestPruneKeepsRenewedIdempotencyKey: a key that Submit renews while the
// prune waits for its row is kept (the prune re-checks the new version).
func TestPruneKeepsRenewedIdempotencyKey(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	s.cfg.IdempotencyTTL = time.Hour
	ctx := context.Background()
	keyID := apiKey(t, db)
	r := Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	if _, err := s.Submit(ctx, keyID, AllProjects, r, "renewed"); err != nil {
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
	done := make(chan Pruned, 1)
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

// TestPruneWhileAnotherReplicaPrunes: while one replica's batch (here
// deleting the first member of each group, not committed yet) is in
// flight, another replica's prune leaves the deployments to it instead of
// counting the groups' members from a snapshot that misses the first
// replica's count (which left the marks of emptied groups behind for
// good); the next prune deletes the rest and every group's marks.
func TestPruneWhileAnotherReplicaPrunes(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	const groups = 50
	// Member 1 of each group finished 100 days ago, member 2 40 days ago.
	pairGroups(t, db, groups, 100*24*time.Hour, 40*24*time.Hour)
	// Replica A, with a retention of 60 days, deletes the first members.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, pruneLock).Scan(&locked); err != nil || !locked {
		t.Fatalf("replica A's prune lock: %v %v", locked, err)
	}
	var n, g int64
	if err := tx.QueryRow(ctx, pruneDeployments, s.now().Add(-60*24*time.Hour), pruneBatch).Scan(&n, &g); err != nil || n != groups || g != 0 {
		t.Fatalf("replica A's batch: %d deployments, %d groups, %v", n, g, err)
	}
	// Replica B, with a retention of 30 days, prunes meanwhile.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if got, err := s.Prune(bctx, 30*24*time.Hour); err != nil || got != (Pruned{}) {
		t.Fatalf("replica B during A's batch: %+v, %v; want it to leave the deployments to A", got, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Prune(ctx, 30*24*time.Hour); err != nil || got != (Pruned{Deployments: groups, Groups: groups}) {
		t.Errorf("replica B after A's batch: %+v, %v; want the %d second members and their groups", got, err, groups)
	}
	var marks int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM deployment_publish_groups`).Scan(&marks); err != nil || marks != 0 {
		t.Errorf("%d group marks left (%v), want none", marks, err)
	}
}
