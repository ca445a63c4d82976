package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// TestSubmitJobs: one job submitted under three Idempotency-Keys at once
// is three jobs, stored and published once each; submitted again with one
// more key, the three replay their jobs and only the fourth is new; a key
// used for another request is refused on its own, the others still made.
func TestSubmitJobs(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	e.Key("batch", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	var keyID string
	if err := e.DB.QueryRow(ctx, `SELECT id::text FROM api_keys WHERE name = 'batch'`).Scan(&keyID); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(jobRequest())
	var r deployments.JobRequest
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	v := deployments.Visibility{Projects: []string{dt.Project}}
	submit := func(r deployments.JobRequest, keys ...string) []deployments.Submitted {
		t.Helper()
		out, err := e.Parts.Deployments.SubmitJobs(ctx, keyID, v, r, keys)
		if err != nil || len(out) != len(keys) {
			t.Fatalf("SubmitJobs: %d of %d (%v)", len(out), len(keys), err)
		}
		return out
	}
	first := submit(r, "a", "b", "c")
	ids := map[string]bool{}
	for _, s := range first {
		if s.Err != nil || s.Submission.Replayed || s.Submission.Deployment.RequestID == "" {
			t.Fatalf("first batch: %+v", s)
		}
		ids[s.Submission.Deployment.ID] = true
	}
	again := submit(r, "a", "b", "c", "d")
	for i, s := range again[:3] {
		if s.Err != nil || !s.Submission.Replayed || s.Submission.Deployment.ID != first[i].Submission.Deployment.ID {
			t.Errorf("key %d again: %+v, want its first job replayed", i, s)
		}
	}
	if d := again[3]; d.Err != nil || d.Submission.Replayed || ids[d.Submission.Deployment.ID] {
		t.Errorf("a new key: %+v", d)
	}
	other := r
	other.Options.Limit = "web-1"
	mixed := submit(other, "a", "e")
	if !errors.Is(mixed[0].Err, deployments.ErrIdempotencyMismatch) || mixed[1].Err != nil || mixed[1].Submission.Replayed {
		t.Errorf("a used key with another request, and a new one: %+v %+v", mixed[0], mixed[1])
	}
	var stored int
	if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM deployments WHERE kind = 'job' AND published_at IS NOT NULL`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if q, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); stored != 5 || q != 5 {
		t.Errorf("%d jobs stored and published, %d queued; want 5", stored, q)
	}
}
