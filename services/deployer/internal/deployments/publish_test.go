package deployments

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// storeUnpublished stores a deployment created age ago and never
// published, and returns its id (its job id too).
func storeUnpublished(t *testing.T, s *Service, age time.Duration) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	r := Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", Branch: "main", ServerIP: "198.51.100.7", Port: 22}
	err := s.committer.insert(context.Background(), []*commitItem{{id: id, args: []any{id, nil, r.ProjectID, r.RepoFullName, r.Branch, r.ServerIP, r.Port,
		r.Modules, r.GitHubTokenRef, r.SecretsRef, r.CorrelationID, nil, "", s.now().Add(-age), id}}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// republished returns the one entry on queue, which must be the request
// of job, and the request.
func republished(t *testing.T, rdb *redis.Client, queue, job string) (string, *messages.AnsibleDeployMessage) {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %v, %v; want one entry", entries, err)
	}
	data, _ := entries[0].Values[stream.DataField].(string)
	m, err := messages.DecodeAnsibleDeployMessage([]byte(data))
	if err != nil || m.JobID != job {
		t.Fatalf("republished entry: %+v, %v; want job %s", m, err, job)
	}
	return entries[0].ID, m
}

// TestRepublish: a deployment stored but never published (Redis was down,
// or the process died between the commit and the XADD) is published by the
// republisher once it is older than After, and marked; a recent one and a
// published one are left alone.
func TestRepublish(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx := context.Background()
	store := func(age time.Duration) string { return storeUnpublished(t, s, age) }
	lost := store(2 * time.Minute)
	store(0) // too recent: left alone
	published := store(2 * time.Minute)
	if _, err := db.Exec(ctx, `UPDATE deployments SET published_at = now(), request_id = '1-1' WHERE id = $1`, published); err != nil {
		t.Fatal(err)
	}

	n, err := s.republish(ctx, time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("republish: %d, %v; want 1", n, err)
	}
	entryID, _ := republished(t, rdb, streams.Queue, lost)
	s.marker.flush(ctx)
	var requestID string
	var marked bool
	if err := db.QueryRow(ctx, `SELECT COALESCE(request_id, ''), published_at IS NOT NULL FROM deployments WHERE id = $1`, lost).Scan(&requestID, &marked); err != nil {
		t.Fatal(err)
	}
	if !marked || requestID != entryID {
		t.Errorf("republished deployment: marked %v, request id %q; want %s", marked, requestID, entryID)
	}
	// Marked now: the next pass publishes nothing.
	if n, err := s.republish(ctx, time.Minute); err != nil || n != 0 {
		t.Errorf("second pass: %d, %v; want 0", n, err)
	}
}
