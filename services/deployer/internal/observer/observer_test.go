package observer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/observer"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/publishing"
)

// newTestObserver returns an Observer and the deployments service it
// stores for, on a fresh database and real Redis, with streams of their
// own.
func newTestObserver(t *testing.T) (*observer.Observer, *deployments.Service, *pgxpool.Pool) {
	t.Helper()
	db, rdb := testenv.Pool(t), testenv.Redis(t)
	streams := deployments.Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-")}
	p, err := publishing.New(db, stream.NewProducer(rdb, stream.ProducerOptions{}), publishing.Config{Queue: streams.Queue}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := deployments.New(db, stream.NewJobs(rdb), p, deployments.NewNotifier(rdb, testenv.Unique("n-"), zerolog.Nop()),
		deployments.Config{Streams: streams}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return observer.New(rdb, streams.Queue, db, p, zerolog.Nop()), s, db
}

// TestResultRacesObserver: a request another producer queued is stored by
// the observer while its result may be recorded at the same moment (infra
// can be faster than the observer's batches). Whichever comes first, every
// job ends with its result, once: none stays queued, none is counted a
// duplicate and dropped, and each shows its request (the repository comes
// only with the request).
func TestResultRacesObserver(t *testing.T) {
	t.Parallel()
	o, s, db := newTestObserver(t)
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
			if err := o.Batch(ctx, []*stream.Message{{ID: entry, Values: map[string]any{messages.DataField: string(data)}}}); err != nil {
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

// TestObserveFrom: the observer starts after the newest request entry the
// deployer has the request of: "0" with none; not after a deployment its
// result created before the observer read the request (so that the
// request is still read and fills in its fields).
func TestObserveFrom(t *testing.T) {
	t.Parallel()
	o, s, db := newTestObserver(t)
	ctx := context.Background()
	from := func() string {
		t.Helper()
		id, err := o.From(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if got := from(); got != "0" {
		t.Fatalf("empty database: from %q, want 0", got)
	}
	observe := func(jobID, entry string) {
		t.Helper()
		data, err := messages.Encode(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: jobID},
			ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.9", Port: 22})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Batch(ctx, []*stream.Message{{ID: entry, Values: map[string]any{messages.DataField: string(data)}}}); err != nil {
			t.Fatal(err)
		}
	}
	observe("seen-1", "5-0")
	if got := from(); got != "5-0" {
		t.Fatalf("after an observed request: from %q, want 5-0", got)
	}
	// A newer job whose result came first: not a place to resume after.
	r := messages.NewAnsibleDeployResult(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: "result-first"}}, "7-0")
	r.Status = messages.StatusSucceeded
	if err := s.Record(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := from(); got != "5-0" {
		t.Fatalf("with a deployment its result created: from %q, want 5-0", got)
	}
	// Once its request is read, it is.
	observe("result-first", "7-0")
	if got := from(); got != "7-0" {
		t.Fatalf("after its request was read: from %q, want 7-0", got)
	}
	d, err := s.Get(ctx, "result-first")
	if err != nil || d.Request.RepoFullName != "acme/shop" || d.Status != deployments.StatusSucceeded {
		t.Errorf("deployment after its request was read: %+v, %v", d, err)
	}
	// An Ansible job's entry is of another stream (ansible:job:queue): not
	// a place to resume the deploy queue after.
	job := &deployments.Row{ID: "01a20000-0000-7000-8000-0000000000aa", ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		CreatedAt: time.Now(), Kind: deployments.KindJob, JobRequest: []byte(`{"source":{"type":"playbook"}}`), Queue: "ansible:job:queue"}
	if err := deployments.InsertRow(ctx, db, job, "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE deployments SET request_id = '9-0', published_at = now() WHERE id = $1`, job.ID); err != nil {
		t.Fatal(err)
	}
	if got := from(); got != "7-0" {
		t.Fatalf("with a newer Ansible job: from %q, want 7-0", got)
	}
}
