package publishing

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// storeUnpublished stores a deployment created age ago and never
// published, and returns its id (its job id too).
func storeUnpublished(t *testing.T, s *fixture, age time.Duration) string {
	t.Helper()
	row := testRow(s, "", age)
	if err := deployments.InsertRow(context.Background(), s.db, row, "", 0); err != nil {
		t.Fatal(err)
	}
	return row.ID
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

// TestRepublishGroupCrash: the process died between a group's commit and
// its XADDs (stored, not published, no mark): the republisher publishes
// each of its deployments once, and none of a group that was published and
// marked, nor a cancelled one; then every deployment shows its entry id and
// the next pass publishes nothing.
func TestRepublishGroupCrash(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx := context.Background()
	storeGroup := func(n int) []*commitItem {
		var group []*commitItem
		for range n {
			row := testRow(s, "", 2*time.Minute)
			group = append(group, &commitItem{row: row})
		}
		if err := insertItems(ctx, s, group); err != nil {
			t.Fatal(err)
		}
		return group
	}
	lost := storeGroup(3) // the crash: stored, never published
	published := storeGroup(2)
	var entries []string
	for range published {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: streams.Queue, Values: map[string]any{stream.DataField: "published before"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, id)
	}
	s.marker.markGroup(published[0].row.ID, entries)
	s.marker.flush(ctx)
	if _, err := db.Exec(ctx, `UPDATE deployments SET status = 'cancelled' WHERE id = $1`, lost[2].row.ID); err != nil {
		t.Fatal(err)
	}

	n, err := s.republish(ctx, time.Minute)
	if err != nil || n != 2 {
		t.Fatalf("republish: %d, %v; want the 2 queued deployments of the lost group", n, err)
	}
	s.marker.flush(ctx)
	all, err := rdb.XRange(ctx, streams.Queue, "-", "+").Result()
	if err != nil || len(all) != 4 {
		t.Fatalf("queue: %d entries, %v; want 2 published before and 2 republished", len(all), err)
	}
	jobs := map[string]string{}
	for _, e := range all[2:] {
		data, _ := e.Values[stream.DataField].(string)
		m, err := messages.DecodeAnsibleDeployMessage([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		jobs[m.JobID] = e.ID
	}
	for i, it := range append(lost[:2:2], published...) {
		d, err := s.Get(ctx, it.row.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := jobs[it.row.ID]
		if i >= 2 {
			want = entries[i-2]
		}
		if d.RequestID != want || want == "" {
			t.Errorf("deployment %d: request id %q, want %q", i, d.RequestID, want)
		}
	}
	if n, err := s.republish(ctx, time.Minute); err != nil || n != 0 {
		t.Errorf("second pass: %d, %v; want 0", n, err)
	}
}

// TestRunRepublishesOnce: the republisher's loop (pkg/outbox) publishes
// each lost deployment once over many passes: its marks are written before
// the next pass looks again.
func TestRunRepublishesOnce(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx, cancel := context.WithCancel(context.Background())
	lost := map[string]bool{}
	for range 3 {
		lost[storeUnpublished(t, s, 2*time.Minute)] = true
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, RepublisherConfig{After: time.Minute, Interval: 10 * time.Millisecond}) }()
	testenv.WaitFor(t, 30*time.Second, "the lost deployments marked published", func() bool {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM deployments WHERE published_at IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(lost)
	})
	time.Sleep(100 * time.Millisecond) // ten more passes
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(context.Background(), streams.Queue, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range entries {
		data, _ := e.Values[stream.DataField].(string)
		m, err := messages.DecodeAnsibleDeployMessage([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		seen[m.JobID]++
	}
	for id := range lost {
		if seen[id] != 1 {
			t.Errorf("deployment %s published %d times, want once", id, seen[id])
		}
	}
	if len(entries) != len(lost) {
		t.Errorf("%d entries on the queue, want %d", len(entries), len(lost))
	}
}

// TestRepublishJob: an Ansible job stored but never published is
// republished to the stream of its pool, as the job it was: credentials as
// the references stored, without the callback URL.
func TestRepublishJob(t *testing.T) {
	t.Parallel()
	s, _, rdb, _ := newTestService(t)
	ctx := context.Background()
	req := deployments.JobRequest{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		Source:      deployments.JobSource{Type: "playbook", Repository: "https://git.example.com/o/p.git", Paths: []string{"site.yml"}},
		Inventory:   deployments.JobInventory{Type: "inline", Hosts: deployments.JobHosts{"web-1": {"http_port": float64(8080)}}},
		Credentials: deployments.JobCredentials{SSH: "vault:secret/projects/9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f/ssh"},
		Options:     deployments.JobOptions{Pool: "gpu"}}
	queue := testenv.Unique("jobs-") + ":gpu"
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	row := testRow(s, "", 2*time.Minute)
	row.RepoFullName, row.ServerIP, row.Port = "", "", 0
	row.Kind, row.JobRequest, row.Queue, row.CallbackURL = deployments.KindJob, data, queue, "https://ci.example.com/hook?token=x"
	if err := deployments.InsertRow(ctx, s.db, row, "", 0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.republish(ctx, time.Minute); err != nil || n != 1 {
		t.Fatalf("republish: %d, %v; want 1", n, err)
	}
	entries, err := rdb.XRange(ctx, queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("job queue: %v, %v", entries, err)
	}
	raw, _ := entries[0].Values[stream.DataField].(string)
	m, err := messages.DecodeAnsibleJobMessage([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if m.JobID != row.ID || m.Credentials.SSH != req.Credentials.SSH || m.Options.Pool != "gpu" || m.Options.CallbackURL != "" ||
		m.Inventory.Hosts["web-1"]["http_port"] != int64(8080) {
		t.Errorf("republished job %+v", m)
	}
}
