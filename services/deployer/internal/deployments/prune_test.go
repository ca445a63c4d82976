package deployments

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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
	stored := func(entries []string, rows ...*Row) {
		t.Helper()
		if err := InsertGroup(ctx, db, rows[0].ID, rows); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO deployment_publish_groups (id, entries) VALUES ($1, $2)`, rows[0].ID, entries); err != nil {
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
	a := []*Row{testRow(s, "", old), testRow(s, "", old), testRow(s, "", old)}
	stored([]string{"1-1", "1-2", "1-3"}, a...)
	finish(a[0].ID, StatusSucceeded, old-time.Hour)
	finish(a[1].ID, StatusCancelled, old-time.Hour)
	// Group b: the second position was refused; both stored rows are old
	// and finished.
	b := []*Row{testRow(s, "", old), testRow(s, "", old)}
	stored([]string{"2-1", "", "2-3"}, b...)
	finish(b[0].ID, StatusFailed, old-time.Hour)
	finish(b[1].ID, StatusRejected, old-time.Hour)
	// Old, but finished within the retention; and recent.
	late := testRow(s, "", old)
	recent := testRow(s, "", time.Hour)
	stored([]string{"3-1", "3-2"}, late, recent)
	finish(late.ID, StatusSucceeded, keep-time.Hour)
	finish(recent.ID, StatusSucceeded, time.Minute)
	// A webhook delivery of a deleted deployment, with an attempt.
	delivery := uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO webhook_deliveries (id, deployment_id, event, url, body, give_up_at, state)
		VALUES ($1, $2, 'deployment.finished', 'https://hooks.example.org/x', '{}', now(), 'delivered')`, delivery, a[0].ID); err != nil {
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
		{"deployments", a[0].ID, false}, {"deployments", a[1].ID, false}, {"deployments", a[2].ID, true},
		{"deployments", b[0].ID, false}, {"deployments", b[1].ID, false},
		{"deployments", late.ID, true}, {"deployments", recent.ID, true},
		{"deployment_publish_groups", a[0].ID, true}, {"deployment_publish_groups", b[0].ID, false},
		{"deployment_publish_groups", late.ID, true}, {"webhook_deliveries", delivery, false},
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
	if d, err := s.Get(ctx, a[2].ID); err != nil || d.RequestID != "1-3" || d.Status != StatusQueued {
		t.Errorf("queued deployment of a pruned group: %+v, %v", d, err)
	}

	// Group a's last deployment ends long ago: it goes, and its group.
	finish(a[2].ID, StatusUnreachable, old-time.Hour)
	if got, err := s.Prune(ctx, keep); err != nil || got != (Pruned{Deployments: 1, Groups: 1}) {
		t.Errorf("second prune: %+v, %v; want one deployment and its group", got, err)
	}
	if exists("deployment_publish_groups", a[0].ID) {
		t.Error("group a outlived its last deployment")
	}
	// Retention 0 keeps everything.
	finish(late.ID, StatusSucceeded, old)
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{}) {
		t.Errorf("prune with retention 0: %+v, %v; want nothing deleted", got, err)
	}
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
