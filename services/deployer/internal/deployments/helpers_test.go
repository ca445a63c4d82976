package deployments

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// testRow returns a deployment row made with API key keyID ("" for none),
// created age ago.
func testRow(s *Service, keyID string, age time.Duration) *Row {
	id := uuid.Must(uuid.NewV7()).String()
	return &Row{ID: id, KeyID: keyID, ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop",
		Branch: "main", ServerIP: "198.51.100.7", Port: 22, CreatedAt: s.now().Add(-age)}
}

// newTestService returns a Service on a fresh database and real Redis, with
// streams of its own. It has no Publisher: the tests of this package do
// not submit (those that do are in the package deployments_test, with the
// package publishing's).
func newTestService(t *testing.T) (*Service, *pgxpool.Pool, *redis.Client, Streams) {
	t.Helper()
	db, rdb := testenv.Pool(t), testenv.Redis(t)
	streams := Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-")}
	s, err := New(db, stream.NewJobs(rdb), nil, NewNotifier(rdb, testenv.Unique("n-"), zerolog.Nop()),
		Config{Streams: streams}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db, rdb, streams
}
