package publishing

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// fixture is a Publisher with the deployments service that submits
// through it, on one database.
type fixture struct {
	*Publisher
	*deployments.Service
}

// newTestService returns a fixture on a fresh database and real Redis,
// with streams of its own.
func newTestService(t *testing.T) (*fixture, *pgxpool.Pool, *redis.Client, deployments.Streams) {
	t.Helper()
	return newTestServiceWith(t, deployments.Config{})
}

// newTestServiceWith is newTestService with the service configured by cfg
// (its streams are the test's own).
func newTestServiceWith(t *testing.T, cfg deployments.Config) (*fixture, *pgxpool.Pool, *redis.Client, deployments.Streams) {
	t.Helper()
	db, rdb := testenv.Pool(t), testenv.Redis(t)
	cfg.Streams = deployments.Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-")}
	p, err := New(db, stream.NewProducer(rdb, stream.ProducerOptions{}), Config{Queue: cfg.Streams.Queue, Tracing: cfg.Tracing}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := deployments.New(db, stream.NewJobs(rdb), p, deployments.NewNotifier(rdb, testenv.Unique("n-"), zerolog.Nop()),
		cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{Publisher: p, Service: s}, db, rdb, cfg.Streams
}

// testRow returns a deployment row made with API key keyID ("" for none),
// created age ago.
func testRow(_ *fixture, keyID string, age time.Duration) *deployments.Row {
	id := uuid.Must(uuid.NewV7()).String()
	return &deployments.Row{ID: id, KeyID: keyID, ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop",
		Branch: "main", ServerIP: "198.51.100.7", Port: 22, CreatedAt: time.Now().Add(-age)}
}

// insertItems stores the rows of group as one commit group, as the
// committer does.
func insertItems(ctx context.Context, s *fixture, group []*commitItem) error {
	rows := make([]*deployments.Row, len(group))
	for i, it := range group {
		rows[i] = it.row
	}
	return deployments.InsertGroup(ctx, s.db, group[0].row.ID, rows)
}

// apiKey stores an API key and returns its id.
func apiKey(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	k, _, err := auth.NewStore(db).Create(context.Background(), auth.NewKey{Name: "publishing", Scopes: []auth.Scope{auth.ScopeDeploymentsWrite}, FleetWide: true})
	if err != nil {
		t.Fatal(err)
	}
	return k.ID
}
