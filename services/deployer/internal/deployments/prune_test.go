package deployments

import (
	"context"
	"crypto/rand"
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

	first, err := s.Submit(ctx, keyID, r, "retry-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Submit(ctx, keyID, r, "retry-1")
	if err != nil || !again.Replayed || again.Deployment.ID != first.Deployment.ID {
		t.Fatalf("retry within the TTL: %+v, %v; want the first deployment replayed", again, err)
	}
	age("retry-1", 2*time.Hour)
	later, err := s.Submit(ctx, keyID, r, "retry-1")
	if err != nil || later.Replayed || later.Deployment.ID == first.Deployment.ID {
		t.Fatalf("retry after the TTL: %+v, %v; want a new deployment", later, err)
	}
	if again, err := s.Submit(ctx, keyID, r, "retry-1"); err != nil || !again.Replayed || again.Deployment.ID != later.Deployment.ID {
		t.Fatalf("retry of the renewed key: %+v, %v; want the new deployment replayed", again, err)
	}
	other := r
	other.Branch = "release"
	age("retry-1", 2*time.Hour)
	if sub, err := s.Submit(ctx, keyID, other, "retry-1"); err != nil || sub.Replayed {
		t.Fatalf("another request with an expired key: %+v, %v; want a new deployment", sub, err)
	}

	if _, err := s.Submit(ctx, keyID, r, "fresh"); err != nil {
		t.Fatal(err)
	}
	age("retry-1", 2*time.Hour)
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{IdempotencyKeys: 1}) {
		t.Errorf("prune: %+v, %v; want the expired key deleted", got, err)
	}
	var keys []string
	rows, _ := db.Query(ctx, `SELECT key FROM idempotency_keys`)
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 1 || keys[0] != "fresh" {
		t.Errorf("keys left %v, want [fresh]", keys)
	}

	// No TTL: an old key is still honoured and not pruned.
	s.cfg.IdempotencyTTL = 0
	age("fresh", 1000*time.Hour)
	if sub, err := s.Submit(ctx, keyID, r, "fresh"); err != nil || !sub.Replayed {
		t.Errorf("old key without a TTL: %+v, %v; want a replay", sub, err)
	}
	if got, err := s.Prune(ctx, 0); err != nil || got != (Pruned{}) {
		t.Errorf("prune without a TTL: %+v, %v; want nothing", got, err)
	}
}

// apiKey stores an API key and returns its id.
func apiKey(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	id := uuid.NewString()
	hash := make([]byte, 32)
	if _, err := rand.Read(hash); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), `INSERT INTO api_keys (id, name, prefix, hash, scopes) VALUES ($1, 'prune', 'ap_x', $2, '{deployments:write}')`,
		id, hash); err != nil {
		t.Fatal(err)
	}
	return id
}
