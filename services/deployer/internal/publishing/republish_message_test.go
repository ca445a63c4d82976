package publishing

import (
	"bytes"
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// TestRepublishSameMessage: a deployment whose publication was lost is
// republished as the very bytes the submit published (one function builds
// both), for a submit through the group committer and one with an
// Idempotency-Key. Only the trace context may differ (the republished copy
// starts a trace of its own); with tracing off both carry none.
func TestRepublishSameMessage(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx := context.Background()
	keyID := apiKey(t, db)
	for _, tc := range []struct {
		name, idemKey string
		req           deployments.Request
	}{
		{"group commit, every field", "", deployments.Request{ProjectID: "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F", RepoFullName: "acme/shop",
			Branch: "release/2", ServerIP: "198.51.100.7", Port: 2222, Modules: []string{"nginx", "php"},
			GitHubTokenRef: "vault:kv/data/github#token", SecretsRef: "vault:kv/data/shop#env", CorrelationID: "corr-7",
			Options: deployments.Options{TimeoutSeconds: 600}}},
		{"idempotency key, defaults", "key-1", deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop",
			ServerIP: "198.51.100.8", Port: 22}},
		{"empty module list", "", deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop",
			ServerIP: "198.51.100.9", Port: 22, Modules: []string{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rdb.Del(ctx, streams.Queue).Err(); err != nil {
				t.Fatal(err)
			}
			sub, err := s.Submit(ctx, keyID, deployments.AllProjects, tc.req, tc.idemKey)
			if err != nil {
				t.Fatal(err)
			}
			id := sub.Deployment.ID
			_, _ = republished(t, rdb, streams.Queue, id)
			first := queueData(t, rdb, streams.Queue)
			// Lose the publication: no entry, no mark.
			s.marker.flush(ctx)
			if _, err := db.Exec(ctx, `DELETE FROM deployment_publish_groups WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(ctx, `UPDATE deployments SET published_at = NULL, request_id = NULL WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			if err := rdb.Del(ctx, streams.Queue).Err(); err != nil {
				t.Fatal(err)
			}
			if n, err := s.republish(ctx, 0); err != nil || n != 1 {
				t.Fatalf("republish: %d, %v; want 1", n, err)
			}
			again := queueData(t, rdb, streams.Queue)
			if !bytes.Equal(first, again) {
				a, _ := messages.DecodeAnsibleDeployMessage(first)
				b, _ := messages.DecodeAnsibleDeployMessage(again)
				t.Errorf("republished message differs:\nsubmit      %+v\nrepublished %+v", a, b)
			}
			s.marker.flush(ctx)
		})
	}
}

// queueData returns the data of the one entry on queue.
func queueData(t *testing.T, rdb *redis.Client, queue string) []byte {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %v, %v; want one entry", entries, err)
	}
	data, _ := entries[0].Values[stream.DataField].(string)
	return []byte(data)
}
