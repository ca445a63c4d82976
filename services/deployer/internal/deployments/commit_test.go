package deployments

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestCommitGroups stores and publishes submits in groups against real
// Postgres and Redis: a group with a row Postgres refuses (an API key that
// does not exist) stores every other row and fails only that submit; every
// stored deployment is on the queue once and marked published; concurrent
// submits all end stored and published once.
func TestCommitGroups(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.marker.run(ctx) }()

	item := func(keyID string) *commitItem {
		id := uuid.Must(uuid.NewV7()).String()
		r := Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
		return &commitItem{id: id, data: []byte("request " + id), done: make(chan struct{}),
			args: []any{id, nullUUID(keyID), r.ProjectID, r.RepoFullName, r.Branch, r.ServerIP, r.Port, r.Modules,
				r.GitHubTokenRef, r.SecretsRef, r.CorrelationID, nil, "", s.now(), id}}
	}
	stored := func(id string) bool {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM deployments WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// One group, one bad row in the middle.
	group := []*commitItem{item(""), item(""), item(uuid.NewString()), item(""), item("")}
	s.committer.commitGroup(group)
	for i, it := range group {
		<-it.done
		bad := i == 2
		if (it.err != nil) != bad || stored(it.id) == bad {
			t.Errorf("item %d (bad %v): err %v, stored %v", i, bad, it.err, stored(it.id))
		}
	}
	if n, _ := rdb.XLen(ctx, streams.Queue).Result(); n != 4 {
		t.Errorf("%d entries on the queue, want 4", n)
	}

	// Concurrent submits through commit.
	const submits = 200
	items := make([]*commitItem, submits)
	var wg sync.WaitGroup
	for i := range items {
		items[i] = item("")
		wg.Go(func() {
			if err := s.committer.commit(items[i]); err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	}
	wg.Wait()
	if n, _ := rdb.XLen(ctx, streams.Queue).Result(); n != 4+submits {
		t.Errorf("%d entries on the queue, want %d", n, 4+submits)
	}
	cancel()
	<-done // the marker wrote what was left
	var unmarked int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM deployments WHERE published_at IS NULL`).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != 0 {
		t.Errorf("%d stored deployments not marked published", unmarked)
	}
	s.committer.mu.Lock()
	defer s.committer.mu.Unlock()
	if s.committer.running != 0 || len(s.committer.queue) != 0 {
		t.Errorf("committers left: %d running, %d queued", s.committer.running, len(s.committer.queue))
	}
}

// TestSubmitFailedCommitIsNotAccepted: when the group cannot be stored,
// Submit returns the error (the API answers 500, never 202) and nothing is
// published.
func TestSubmitFailedCommitIsNotAccepted(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	db.Close() // every statement now fails
	r := Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	var wg sync.WaitGroup
	for range 20 { // concurrent: they fail as groups, and each submit on its own
		wg.Go(func() {
			sub, err := s.Submit(context.Background(), "", r, "")
			if err == nil || sub != nil {
				t.Errorf("submit with the database gone: %+v, %v; want an error", sub, err)
			}
		})
	}
	wg.Wait()
	if n, _ := rdb.XLen(context.Background(), streams.Queue).Result(); n != 0 {
		t.Errorf("%d entries published for submits that were not stored", n)
	}
}

// newTestService returns a Service on a fresh database and real Redis, with
// streams of its own.
func newTestService(t *testing.T) (*Service, *pgxpool.Pool, *redis.Client, Streams) {
	t.Helper()
	db, rdb := testenv.Pool(t), testenv.Redis(t)
	streams := Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-")}
	s, err := New(db, rdb, stream.NewProducer(rdb, stream.ProducerOptions{}), NewNotifier(rdb, testenv.Unique("n-"), zerolog.Nop()),
		Config{Streams: streams}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db, rdb, streams
}
