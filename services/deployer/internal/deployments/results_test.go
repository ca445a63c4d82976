package deployments

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// TestResultRacesObserver: a request another producer queued is stored by
// the observer while its result may be recorded at the same moment (infra
// can be faster than the observer's batches). Whichever comes first, every
// job ends with its result, once: none stays queued, none is counted a
// duplicate and dropped, and each shows its request (the repository comes
// only with the request).
func TestResultRacesObserver(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	const jobs = 300
	var wg sync.WaitGroup
	for i := range jobs {
		m := &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{JobID: fmt.Sprintf("race-%d", i)},
			ProjectID:   "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.9", Port: 22,
		}
		data, err := messages.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		entry := fmt.Sprintf("%d-0", i+1)
		r := messages.NewAnsibleDeployResult(m, entry)
		r.Status = messages.StatusSucceeded
		wg.Go(func() {
			if err := s.ObserveBatch(ctx, []*stream.Message{{ID: entry, Values: map[string]any{messages.DataField: string(data)}}}); err != nil {
				t.Errorf("observe %s: %v", m.JobID, err)
			}
		})
		wg.Go(func() {
			if err := s.Record(ctx, r); err != nil {
				t.Errorf("record %s: %v", m.JobID, err)
			}
		})
	}
	wg.Wait()
	rows, err := db.Query(ctx, `SELECT job_id, status, source FROM deployments
		WHERE status <> 'succeeded' OR result IS NULL OR repo_full_name IS DISTINCT FROM 'acme/shop' OR port <> 22`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var job, status, source string
		if err := rows.Scan(&job, &status, &source); err != nil {
			t.Fatal(err)
		}
		t.Errorf("job %s (%s) ended %s, without its result or its request", job, source, status)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&n); err != nil || n != jobs {
		t.Errorf("%d deployments (%v), want %d", n, err, jobs)
	}
}
