package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

type bundle struct {
	db    *pgxpool.Pool
	clock *clocktest.Fake
}

func setup(t *testing.T) (*fleet.Store, *bundle) {
	t.Helper()
	db := testenv.Pool(t)
	c := clocktest.NewFake(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	return fleet.New(db, fleet.Options{Now: c.Now}), &bundle{db: db, clock: c}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func insert(t *testing.T, db *pgxpool.Pool, handle, status string, labels map[string]string) {
	t.Helper()
	if labels == nil {
		labels = map[string]string{}
	}
	_, err := db.Exec(context.Background(), `INSERT INTO servers (handle, address, status, labels) VALUES ($1, $2, $3, $4)`,
		handle, "192.0.2."+fmt.Sprint(len(handle)), status, labels)
	if err != nil {
		t.Fatalf("insert %s: %v", handle, err)
	}
}

func mustGet(t *testing.T, s *fleet.Store, handle string) *fleet.Server {
	t.Helper()
	srv, err := s.Get(context.Background(), handle)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func events(t *testing.T, s *fleet.Store, handle string) []string {
	t.Helper()
	hist, err := s.History(context.Background(), handle, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		out = append(out, fmt.Sprintf("%s %s->%s by %s", h.Event, h.From, h.To, h.Actor))
	}
	return out
}

func TestListCountAndShow(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "web-1", "READY", map[string]string{"role": "web", "env": "prod"})
	insert(t, b.db, "web-2", "FAILED", map[string]string{"role": "web"})
	insert(t, b.db, "db-1", "READY", map[string]string{"role": "db"})
	insert(t, b.db, "new-1", "NEW", nil)

	yes := true
	tests := []struct {
		name string
		f    fleet.Filter
		want []string
	}{
		{"all", fleet.Filter{}, []string{"db-1", "new-1", "web-1", "web-2"}},
		{"status", fleet.Filter{Statuses: []string{"READY"}}, []string{"db-1", "web-1"}},
		{"label equality", fleet.Filter{Labels: map[string]string{"role": "web"}}, []string{"web-1", "web-2"}},
		{"label existence", fleet.Filter{Labels: map[string]string{"env": "*"}}, []string{"web-1"}},
		{"search", fleet.Filter{Search: "WEB"}, []string{"web-1", "web-2"}},
		{"search escapes like", fleet.Filter{Search: "%"}, nil},
		{"paused", fleet.Filter{Paused: &yes}, nil},
		{"source", fleet.Filter{Source: "man*"}, []string{"db-1", "new-1", "web-1", "web-2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := s.List(ctx, tt.f, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, srv := range page.Servers {
				got = append(got, srv.Handle)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	// Pagination walks every server once.
	var all []string
	after := ""
	for {
		page, err := s.List(ctx, fleet.Filter{}, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, srv := range page.Servers {
			all = append(all, srv.Handle)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if !slices.Equal(all, []string{"db-1", "new-1", "web-1", "web-2"}) {
		t.Errorf("pages gave %v", all)
	}

	// Orders for triage, paged one server at a time (every cursor used):
	// ties broken by handle.
	if _, err := b.db.Exec(ctx, `UPDATE servers SET attempts = CASE handle WHEN 'web-2' THEN 5 WHEN 'new-1' THEN 2 ELSE 0 END,
		status_changed_at = now() - CASE handle WHEN 'db-1' THEN interval '1 minute' WHEN 'web-1' THEN interval '1 hour'
			WHEN 'new-1' THEN interval '2 hours' ELSE interval '3 hours' END`); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		order fleet.Order
		want  []string
	}{
		{fleet.OrderHandle, []string{"db-1", "new-1", "web-1", "web-2"}},
		{fleet.OrderStatus, []string{"web-2", "new-1", "db-1", "web-1"}},
		{fleet.OrderAttempts, []string{"web-2", "new-1", "db-1", "web-1"}},
		{fleet.OrderChanged, []string{"db-1", "web-1", "new-1", "web-2"}},
	} {
		var got []string
		after := ""
		for range 10 {
			page, err := s.List(ctx, fleet.Filter{Order: tt.order}, after, 1)
			if err != nil {
				t.Fatalf("order %q: %v", tt.order, err)
			}
			for _, srv := range page.Servers {
				got = append(got, srv.Handle)
			}
			if after = page.Next; after == "" {
				break
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("order %q: pages gave %v, want %v", tt.order, got, tt.want)
		}
	}
	if _, err := s.List(ctx, fleet.Filter{Order: "bogus"}, "", 0); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("an unknown order: %v, want ErrInvalid", err)
	}
	if _, err := s.List(ctx, fleet.Filter{Order: fleet.OrderAttempts}, "web-1", 0); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("a handle as a cursor of another order: %v, want ErrInvalid", err)
	}

	for _, bad := range []fleet.Filter{{Statuses: []string{"BOGUS"}}, {Labels: map[string]string{"bad key'": "x"}}} {
		if _, err := s.List(ctx, bad, "", 0); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("List(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := s.List(ctx, fleet.Filter{}, "", fleet.MaxPageSize+1); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("oversized page: %v", err)
	}

	counts, err := s.Count(ctx, fleet.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if counts["READY"] != 2 || counts["FAILED"] != 1 || counts["NEW"] != 1 || counts["ORPHANED"] != 0 || len(counts) != 7 {
		t.Errorf("counts %v", counts)
	}

	if _, err := s.Pause(ctx, "web-1", "alice", "maintenance"); err != nil {
		t.Fatal(err)
	}
	d, err := s.Show(ctx, "web-1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Server.Paused || len(d.History) != 1 || d.History[0].Event != fleet.EventPaused || d.History[0].Reason != "maintenance" {
		t.Errorf("show: %+v %+v", d.Server, d.History)
	}
	if _, err := s.Show(ctx, "nope", 0, 0); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("show unknown: %v", err)
	}
}

func TestRequestsPauseResume(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "a", "READY", nil)
	insert(t, b.db, "o", "ORPHANED", nil)

	srv, err := s.RequestAction(ctx, "a", fleet.ActionRebuild, "alice", "disk corrupted")
	if err != nil {
		t.Fatal(err)
	}
	if srv.RequestedAction != fleet.ActionRebuild || srv.RequestedBy != "alice" || srv.RequestedAt.IsZero() {
		t.Errorf("request not recorded: %+v", srv)
	}
	// A newer request replaces the open one.
	if srv, err = s.RequestAction(ctx, "a", fleet.ActionRecovery, "bob", ""); err != nil || srv.RequestedAction != fleet.ActionRecovery {
		t.Fatalf("replace request: %v %+v", err, srv)
	}
	if _, err := s.RequestAction(ctx, "o", fleet.ActionProvision, "alice", ""); !errors.Is(err, fleet.ErrNotAllowed) {
		t.Errorf("request on ORPHANED: %v, want ErrNotAllowed", err)
	}
	if _, err := s.RequestAction(ctx, "a", "explode", "alice", ""); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("bad action: %v", err)
	}
	if _, err := s.RequestAction(ctx, "a", fleet.ActionProvision, " ", ""); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("empty actor: %v", err)
	}
	if _, err := s.RequestAction(ctx, "missing", fleet.ActionProvision, "alice", ""); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("unknown server: %v", err)
	}

	for i := 0; i < 2; i++ { // pausing twice records once
		if srv, err = s.Pause(ctx, "a", "alice", ""); err != nil || !srv.Paused {
			t.Fatalf("pause: %v", err)
		}
	}
	due, err := s.Due(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 0 {
		t.Errorf("a paused server is due: %+v", due)
	}
	if srv, err = s.Resume(ctx, "a", "alice", ""); err != nil || srv.Paused {
		t.Fatalf("resume: %v", err)
	}
	due, _ = s.Due(ctx, 10)
	if len(due) != 1 || due[0].Action != fleet.ActionRecovery || due[0].RequestedBy != "bob" {
		t.Errorf("due after resume: %+v", due)
	}
	want := []string{
		"requested READY->READY by alice", "requested READY->READY by bob",
		"paused READY->READY by alice", "resumed READY->READY by alice",
	}
	if got := events(t, s, "a"); !slices.Equal(got, want) {
		t.Errorf("history\n got %q\nwant %q", got, want)
	}
}

func job(c fleet.Candidate, id string) fleet.Job {
	msg := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: id}, ServerHandle: c.Handle}
	data, err := messages.Encode(msg)
	if err != nil {
		panic(err)
	}
	return fleet.Job{Handle: c.Handle, Version: c.Version, Action: c.Action, JobID: id, Payload: data}
}

func TestDuePriorityAndQueue(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "failed", "FAILED", nil)
	insert(t, b.db, "unreach", "UNREACHABLE", nil)
	insert(t, b.db, "ready-rebuild", "READY", nil)
	insert(t, b.db, "ready-recover", "READY", nil)
	insert(t, b.db, "ready", "READY", nil)
	insert(t, b.db, "new", "NEW", nil)
	insert(t, b.db, "orphan", "ORPHANED", nil)
	if _, err := s.RequestAction(ctx, "ready-rebuild", fleet.ActionRebuild, "op", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestAction(ctx, "ready-recover", fleet.ActionRecovery, "op", ""); err != nil {
		t.Fatal(err)
	}
	due, err := s.Due(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range due {
		got = append(got, fmt.Sprintf("%s:%s:%d", c.Handle, c.Action, c.Priority))
	}
	want := []string{"new:provision:0", "failed:provision:1", "unreach:provision:2", "ready-recover:recovery:3", "ready-rebuild:rebuild:4"}
	if !slices.Equal(got, want) {
		t.Fatalf("due\n got %v\nwant %v", got, want)
	}

	// Two replicas queue the same candidates at once: compare-and-set lets
	// exactly one job per server through.
	var wg sync.WaitGroup
	results := make([][]string, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var jobs []fleet.Job
			for _, c := range due {
				jobs = append(jobs, job(c, fmt.Sprintf("job-%d-%s", r, c.Handle)))
			}
			q, err := s.Queue(ctx, jobs, fmt.Sprintf("replica-%d", r))
			if err != nil {
				t.Error(err)
			}
			results[r] = q
		}()
	}
	wg.Wait()
	if n := len(results[0]) + len(results[1]); n != len(due) {
		t.Errorf("queued %d jobs for %d servers: %v", n, len(due), results)
	}
	var outbox int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&outbox); err != nil {
		t.Fatal(err)
	}
	if outbox != len(due) {
		t.Errorf("outbox has %d messages for %d servers", outbox, len(due))
	}
	srv := mustGet(t, s, "ready-rebuild")
	if srv.Status != fleet.StatusQueued || srv.PendingAction != fleet.ActionRebuild || srv.RequestedAction != "" || srv.PendingJobID == "" {
		t.Errorf("queued server: %+v", srv)
	}
	if rec := mustGet(t, s, "ready-recover"); rec.LastRecoveryAt.IsZero() {
		t.Error("a queued recovery did not start the cool-down")
	}
	if due, _ := s.Due(ctx, 100); len(due) != 0 {
		t.Errorf("servers with a job in flight are due again: %+v", due)
	}
	// A stale version queues nothing.
	if q, err := s.Queue(ctx, []fleet.Job{job(fleet.Candidate{Handle: "ready", Version: 99, Action: fleet.ActionProvision}, "x")}, "r"); err != nil || len(q) != 0 {
		t.Errorf("queue at a stale version: %v %v", q, err)
	}
}

func TestRelay(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	for i := range 30 {
		insert(t, b.db, fmt.Sprintf("s%02d", i), "NEW", nil)
	}
	due, _ := s.Due(ctx, 100)
	var jobs []fleet.Job
	for _, c := range due {
		jobs = append(jobs, job(c, "job-"+c.Handle))
	}
	if _, err := s.Queue(ctx, jobs, "scheduler"); err != nil {
		t.Fatal(err)
	}

	// A failing publish leaves everything in the outbox.
	_, err := s.Relay(ctx, 10, "relay", func(context.Context, []fleet.OutboxEntry) ([]string, error) {
		return nil, errors.New("redis down")
	})
	if err == nil {
		t.Fatal("relay with a failing publish returned nil")
	}
	if n, _, _ := s.OutboxBacklog(ctx); n != 30 {
		t.Errorf("backlog %d after a failed publish, want 30", n)
	}

	// Three relays at once publish every entry exactly once.
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	var total atomic.Int64
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := s.Relay(ctx, 4, "relay", func(_ context.Context, es []fleet.OutboxEntry) ([]string, error) {
					ids := make([]string, len(es))
					mu.Lock()
					for i, e := range es {
						seen[e.JobID]++
						ids[i] = fmt.Sprintf("%d-0", e.ID)
					}
					mu.Unlock()
					return ids, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				total.Add(int64(n))
				if n == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != 30 || total.Load() != 30 {
		t.Errorf("published %d jobs in %d entries, want 30", len(seen), total.Load())
	}
	for j, n := range seen {
		if n != 1 {
			t.Errorf("job %s published %d times", j, n)
		}
	}
	srv := mustGet(t, s, "s00")
	if srv.Status != fleet.StatusProvisioning {
		t.Errorf("status after relay %s", srv.Status)
	}
	want := []string{"detected", "queued NEW->QUEUED by scheduler", "published QUEUED->PROVISIONING by relay"}
	if got := events(t, s, "s00"); !slices.Equal(got, want[1:]) {
		t.Errorf("history %q", got)
	}
	if n, age, _ := s.OutboxBacklog(ctx); n != 0 || age != 0 {
		t.Errorf("backlog %d %v", n, age)
	}
	b.clock.Advance(8 * 24 * time.Hour)
	if n, err := s.PruneOutbox(ctx, 7*24*time.Hour); err != nil || n != 30 {
		t.Errorf("prune: %d %v", n, err)
	}
}

// queueOne queues and relays a job for handle and returns its job id.
func queueOne(t *testing.T, s *fleet.Store, handle string) string {
	t.Helper()
	ctx := context.Background()
	due, err := s.Due(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range due {
		if c.Handle != handle {
			continue
		}
		id := fmt.Sprintf("job-%s-%d", handle, c.Version)
		if q, err := s.Queue(ctx, []fleet.Job{job(c, id)}, "scheduler"); err != nil || len(q) != 1 {
			t.Fatalf("queue %s: %v %v", handle, q, err)
		}
		if _, err := s.Relay(ctx, 1000, "relay", func(_ context.Context, es []fleet.OutboxEntry) ([]string, error) {
			ids := make([]string, len(es))
			for i := range es {
				ids[i] = fmt.Sprintf("%d-%d", time.Now().UnixMilli(), i)
			}
			return ids, nil
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	t.Fatalf("%s is not due", handle)
	return ""
}

func notifications(t *testing.T, db *pgxpool.Pool, handle string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT status FROM notifications WHERE handle = $1 ORDER BY id`, handle)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var st string
		if err := rows.Scan(&st); err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

func TestApplyResultRetriesAndDedup(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "a", "NEW", nil)
	policy := fleet.RetryPolicy{Limit: 3, Backoff: func(n int) time.Duration { return time.Duration(n) * time.Minute }, UnreachableCooldown: 10 * time.Minute}
	fail := func(id string) (fleet.Outcome, *fleet.Server) {
		t.Helper()
		o, srv, err := s.ApplyResult(ctx, fleet.Result{Handle: "a", JobID: id, Status: messages.StatusFailed,
			Error: "task X failed", ErrorKind: messages.KindPlaybookFailed}, "results", policy)
		if err != nil {
			t.Fatal(err)
		}
		return o, srv
	}

	j1 := queueOne(t, s, "a")
	o, srv := fail(j1)
	if o != fleet.Applied || srv.Status != fleet.StatusFailed || srv.Attempts != 1 || srv.RetriesExhausted ||
		!srv.NextAttemptAt.Equal(b.clock.Now().Add(time.Minute)) || srv.LastError != "task X failed" {
		t.Fatalf("first failure: %s %+v", o, srv)
	}
	// A redelivered result changes nothing.
	if o, _ := fail(j1); o != fleet.Duplicate {
		t.Errorf("redelivered result: %s", o)
	}
	if srv2 := mustGet(t, s, "a"); srv2.Version != srv.Version {
		t.Errorf("a duplicate result changed the server (version %d -> %d)", srv.Version, srv2.Version)
	}
	// Not due before the backoff is over.
	if due, _ := s.Due(ctx, 10); len(due) != 0 {
		t.Errorf("due during backoff: %+v", due)
	}
	b.clock.Advance(time.Minute)
	j2 := queueOne(t, s, "a")
	// A result of another job (j1 again, late) is stale: recorded, ignored.
	if o, _ := fail("job-other"); o != fleet.Stale {
		t.Errorf("result of another job: %s", o)
	}
	if got := mustGet(t, s, "a"); got.Status != fleet.StatusProvisioning || got.PendingJobID != j2 {
		t.Errorf("a stale result moved the server: %+v", got)
	}
	if _, srv = fail(j2); srv.Attempts != 2 || !srv.NextAttemptAt.Equal(b.clock.Now().Add(2*time.Minute)) {
		t.Errorf("second failure: %+v", srv)
	}
	if n := notifications(t, b.db, "a"); len(n) != 0 {
		t.Errorf("notified while retries remain: %v", n)
	}
	b.clock.Advance(2 * time.Minute)
	j3 := queueOne(t, s, "a")
	if _, srv = fail(j3); srv.Attempts != 3 || !srv.RetriesExhausted || !srv.NextAttemptAt.IsZero() {
		t.Errorf("third failure: %+v", srv)
	}
	if n := notifications(t, b.db, "a"); !slices.Equal(n, []string{"FAILED"}) {
		t.Errorf("notifications after exhaustion: %v", n)
	}
	b.clock.Advance(time.Hour)
	if due, _ := s.Due(ctx, 10); len(due) != 0 {
		t.Errorf("exhausted server is due: %+v", due)
	}
	// An operator's request gives a fresh budget; success resets attempts.
	if _, err := s.RequestAction(ctx, "a", fleet.ActionProvision, "alice", "fixed the repo"); err != nil {
		t.Fatal(err)
	}
	j4 := queueOne(t, s, "a")
	o, srv, err := s.ApplyResult(ctx, fleet.Result{Handle: "a", JobID: j4, Status: messages.StatusSucceeded}, "results", policy)
	if err != nil || o != fleet.Applied || srv.Status != fleet.StatusReady || srv.Attempts != 0 || srv.LastError != "" {
		t.Fatalf("success: %s %+v %v", o, srv, err)
	}
	if n := notifications(t, b.db, "a"); !slices.Equal(n, []string{"FAILED", "READY"}) {
		t.Errorf("notifications: %v", n)
	}
	hist, _ := s.History(ctx, "a", 100)
	var stale int
	for _, h := range hist {
		if h.Event == fleet.EventStaleResult && h.JobID == "job-other" {
			stale++
		}
	}
	if stale != 1 {
		t.Errorf("stale result recorded %d times", stale)
	}
}

func TestApplyResultUnreachableRejectedOrphaned(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	policy := fleet.RetryPolicy{Limit: 5, Backoff: func(int) time.Duration { return time.Minute }, UnreachableCooldown: 10 * time.Minute}
	insert(t, b.db, "u", "NEW", nil)
	insert(t, b.db, "r", "NEW", nil)
	insert(t, b.db, "o", "NEW", nil)
	insert(t, b.db, "i", "NEW", nil)

	ju := queueOne(t, s, "u")
	_, srv, err := s.ApplyResult(ctx, fleet.Result{Handle: "u", JobID: ju, Status: messages.StatusUnreachable, Error: "connection refused"}, "results", policy)
	if err != nil || srv.Status != fleet.StatusUnreachable || !srv.NextAttemptAt.Equal(b.clock.Now().Add(10*time.Minute)) {
		t.Fatalf("unreachable: %+v %v", srv, err)
	}
	if due, _ := s.Due(ctx, 10); len(due) != 3 { // r, o, i
		t.Errorf("unreachable due before its cool-down: %+v", due)
	}
	b.clock.Advance(10 * time.Minute)
	ju2 := queueOne(t, s, "u")
	if _, srv, _ = s.ApplyResult(ctx, fleet.Result{Handle: "u", JobID: ju2, Status: messages.StatusUnreachable, Error: "still down"}, "results", policy); srv.Status != fleet.StatusUnreachable {
		t.Fatal(srv.Status)
	}
	if n := notifications(t, b.db, "u"); !slices.Equal(n, []string{"UNREACHABLE"}) {
		t.Errorf("unreachable twice notified %v, want once", n)
	}

	jr := queueOne(t, s, "r")
	if _, srv, _ = s.ApplyResult(ctx, fleet.Result{Handle: "r", JobID: jr, Status: messages.StatusRejected, Error: "server_not_found"}, "results", policy); srv.Status != fleet.StatusFailed || !srv.RetriesExhausted {
		t.Errorf("rejected: %+v", srv)
	}

	// The source drops a server while its job runs: it stays ORPHANED and
	// remembers the outcome for its return.
	jo := queueOne(t, s, "o")
	if _, err := b.db.Exec(ctx, `UPDATE servers SET orphaned_from = status, status = 'ORPHANED' WHERE handle = 'o'`); err != nil {
		t.Fatal(err)
	}
	if _, srv, _ = s.ApplyResult(ctx, fleet.Result{Handle: "o", JobID: jo, Status: messages.StatusSucceeded}, "results", policy); srv.Status != fleet.StatusOrphaned || srv.OrphanedFrom != fleet.StatusReady || srv.PendingJobID != "" {
		t.Errorf("result on an orphaned server: %+v", srv)
	}

}

func TestTransition(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "a", "READY", nil)
	srv := mustGet(t, s, "a")
	if _, err := s.Transition(ctx, fleet.TransitionRequest{Handle: "a", Version: srv.Version + 1, To: "UNREACHABLE", Actor: "infra"}); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("stale version: %v", err)
	}
	if _, err := s.Transition(ctx, fleet.TransitionRequest{Handle: "a", From: []string{"NEW"}, To: "UNREACHABLE", Actor: "infra"}); !errors.Is(err, fleet.ErrNotAllowed) {
		t.Errorf("wrong from: %v", err)
	}
	got, err := s.Transition(ctx, fleet.TransitionRequest{Handle: "a", Version: srv.Version, To: "UNREACHABLE", Actor: "infra", JobID: "j", Error: "down", Reason: "ssh check"})
	if err != nil || got.Status != "UNREACHABLE" || got.LastError != "down" || got.LastJobID != "j" || got.Version <= srv.Version {
		t.Fatalf("transition: %+v %v", got, err)
	}
	if n := notifications(t, b.db, "a"); !slices.Equal(n, []string{"UNREACHABLE"}) {
		t.Errorf("notifications %v", n)
	}
	if ev := events(t, s, "a"); !slices.Equal(ev, []string{"transition READY->UNREACHABLE by infra"}) {
		t.Errorf("history %v", ev)
	}
}

func TestSync(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "manual-1", "READY", nil)
	src := "static:inv.yml"
	det := func(h, addr string, labels map[string]string) fleet.Detected {
		return fleet.Detected{Handle: h, Address: addr, Labels: labels}
	}
	sync := func(req fleet.SyncRequest) fleet.SyncStats {
		t.Helper()
		req.Actor = "detector:" + req.Source
		st, err := s.Sync(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := sync(fleet.SyncRequest{Source: src, Servers: []fleet.Detected{
		det("web-1", "192.0.2.1", map[string]string{"group:web": ""}),
		det("web-2", "192.0.2.2", nil),
		det("manual-1", "192.0.2.9", nil), // a manual server is never taken over
	}, TakeOverFrom: []string{"time4vps"}})
	if st.Detected != 2 || st.Skipped != 1 {
		t.Errorf("first sync: %+v", st)
	}
	if m := mustGet(t, s, "manual-1"); m.Source != "manual" || m.Address == "192.0.2.9" {
		t.Errorf("manual server changed by a detector: %+v", m)
	}
	w := mustGet(t, s, "web-1")
	if w.Status != "NEW" || w.Source != src || w.SSHPort != 22 || w.SSHUser != "root" || w.Labels["group:web"] != "" || w.SourceHash == "" {
		t.Errorf("detected server: %+v", w)
	}
	// Same listing again: nothing written.
	st = sync(fleet.SyncRequest{Source: src, Servers: []fleet.Detected{det("web-1", "192.0.2.1", map[string]string{"group:web": ""}), det("web-2", "192.0.2.2", nil)}})
	if st.Unchanged != 2 || st.Updated+st.Detected+st.Orphaned != 0 {
		t.Errorf("unchanged sync: %+v", st)
	}
	if w2 := mustGet(t, s, "web-1"); w2.Version != w.Version {
		t.Error("an unchanged server was written")
	}
	// web-1 changes address; web-2 vanishes (READY first).
	if _, err := b.db.Exec(ctx, `UPDATE servers SET status = 'READY' WHERE handle = 'web-2'`); err != nil {
		t.Fatal(err)
	}
	st = sync(fleet.SyncRequest{Source: src, Servers: []fleet.Detected{det("web-1", "192.0.2.11", nil)}})
	if st.Updated != 1 || st.Orphaned != 1 {
		t.Errorf("change sync: %+v", st)
	}
	if w := mustGet(t, s, "web-1"); w.Address != "192.0.2.11" || len(w.Labels) != 0 {
		t.Errorf("updated: %+v", w)
	}
	if o := mustGet(t, s, "web-2"); o.Status != fleet.StatusOrphaned || o.OrphanedFrom != fleet.StatusReady {
		t.Errorf("vanished: %+v", o)
	}
	// It comes back: READY again.
	st = sync(fleet.SyncRequest{Source: src, Servers: []fleet.Detected{det("web-1", "192.0.2.11", nil), det("web-2", "192.0.2.2", nil)}})
	if st.Returned != 1 {
		t.Errorf("return sync: %+v", st)
	}
	if o := mustGet(t, s, "web-2"); o.Status != fleet.StatusReady || o.OrphanedFrom != "" {
		t.Errorf("returned: %+v", o)
	}
	want := []string{"detected ->NEW by detector:" + src, "orphaned READY->ORPHANED by detector:" + src, "returned ORPHANED->READY by detector:" + src}
	if got := events(t, s, "web-2"); !slices.Equal(got, want) {
		t.Errorf("history\n got %q\nwant %q", got, want)
	}
	// A server listed by another source this tick is not orphaned; that
	// source takes it over.
	st = sync(fleet.SyncRequest{Source: src, Servers: []fleet.Detected{det("web-1", "192.0.2.11", nil)}, Keep: map[string]bool{"web-2": true}})
	if st.Orphaned != 0 {
		t.Errorf("kept server orphaned: %+v", st)
	}
	st = sync(fleet.SyncRequest{Source: "time4vps", Servers: []fleet.Detected{det("web-2", "192.0.2.2", nil)}, TakeOverFrom: []string{src}})
	if st.Detected != 1 {
		t.Errorf("take over: %+v", st)
	}
	if o := mustGet(t, s, "web-2"); o.Source != "time4vps" || o.Status != fleet.StatusReady {
		t.Errorf("taken over: %+v", o)
	}
	// A listing that would orphan too much is refused.
	if _, err := s.Sync(ctx, fleet.SyncRequest{Source: src, Actor: "d"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(ctx, fleet.SyncRequest{Source: "time4vps", Actor: "d"}); err != nil {
		t.Fatal(err)
	}
	sync(fleet.SyncRequest{Source: "ec2:a", Servers: []fleet.Detected{det("e1", "192.0.2.21", nil), det("e2", "192.0.2.22", nil), det("e3", "192.0.2.23", nil)}})
	if _, err := s.Sync(ctx, fleet.SyncRequest{Source: "ec2:a", Actor: "d", MaxOrphanFraction: 0.9}); !errors.Is(err, fleet.ErrTooManyOrphans) {
		t.Errorf("orphaning all: %v", err)
	}
	if e := mustGet(t, s, "e1"); e.Status != fleet.StatusNew {
		t.Errorf("a refused sync changed %+v", e)
	}
	for _, bad := range []fleet.SyncRequest{
		{Source: "manual", Actor: "d"},
		{Source: "x", Actor: "d", Servers: []fleet.Detected{det("bad handle", "a", nil)}},
		{Source: "x", Actor: "d", Servers: []fleet.Detected{det("a", "", nil)}},
		{Source: "x", Actor: "d", Servers: []fleet.Detected{det("a", "h", nil), det("a", "h", nil)}},
	} {
		if _, err := s.Sync(ctx, bad); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("Sync(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestDeliverExactlyOnce(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "before", "NEW", nil)
	if _, err := s.Transition(ctx, fleet.TransitionRequest{Handle: "before", To: "READY", Actor: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureChannel(ctx, "slack"); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		h := fmt.Sprintf("s%d", i)
		insert(t, b.db, h, "NEW", nil)
		if _, err := s.Transition(ctx, fleet.TransitionRequest{Handle: h, To: "READY", Actor: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.PendingNotifications(ctx, "slack"); n != 5 {
		t.Errorf("pending %d, want 5 (the backlog before the channel is not sent)", n)
	}
	// A failed send records nothing.
	if _, err := s.Deliver(ctx, "slack", 10, func(context.Context, []fleet.Notification) error { return errors.New("429") }); err == nil {
		t.Fatal("failed send returned nil")
	}
	var got []string
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				_, err := s.Deliver(ctx, "slack", 2, func(_ context.Context, batch []fleet.Notification) error {
					mu.Lock()
					for _, x := range batch {
						got = append(got, x.Handle)
					}
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(got)
	if !slices.Equal(got, []string{"s0", "s1", "s2", "s3", "s4"}) {
		t.Errorf("delivered %v", got)
	}
	if n, _ := s.PendingNotifications(ctx, "slack"); n != 0 {
		t.Errorf("pending %d after delivery", n)
	}
}

func TestStuckAndRequeue(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "lost", "NEW", nil)
	insert(t, b.db, "done", "NEW", nil)
	insert(t, b.db, "running", "NEW", nil)
	jl, jd, jr := queueOne(t, s, "lost"), queueOne(t, s, "done"), queueOne(t, s, "running")
	if _, err := b.db.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, state, status, result, finished_at)
		VALUES ($1, 'provision', 'provisioner:queue', '1-0', 'done', 'done', 'done', 'succeeded', '\x81', now())`, jd); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, updated_at)
		VALUES ($1, 'provision', 'provisioner:queue', '1-0', 'running', 'running', $2)`, jr, b.clock.Now().Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Stuck(ctx, time.Hour, 10); len(st) != 0 {
		t.Errorf("stuck right away: %+v", st)
	}
	b.clock.Advance(2 * time.Hour)
	st, err := s.Stuck(ctx, time.Hour, 10)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fleet.StuckJob{}
	for _, j := range st {
		got[j.Handle] = j
	}
	if len(got) != 2 || got["lost"].JobID != jl || got["lost"].RunState != "" || got["done"].RunState != "done" || len(got["done"].Result) == 0 {
		t.Fatalf("stuck: %+v", st)
	}
	ok, err := s.Requeue(ctx, "lost", jl, "scheduler", "no result after 1h")
	if err != nil || !ok {
		t.Fatalf("requeue: %v %v", ok, err)
	}
	var n int
	_ = b.db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE job_id = $1 AND published_at IS NULL`, jl).Scan(&n)
	if n != 1 {
		t.Errorf("requeue wrote %d outbox rows", n)
	}
	if ok, _ := s.Requeue(ctx, "lost", "other-job", "scheduler", ""); ok {
		t.Error("requeued a job the server does not wait for")
	}
}

func TestValidHandleMatchesThePattern(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(messages.ServerHandlePattern)
	for _, h := range []string{"a", "web-1", "A.b_c:d@e-f", "-x", ".x", "x y", "", "é", strings.Repeat("a", 128), strings.Repeat("a", 129), "a/b", "1"} {
		d := fleet.Detected{Handle: h, Address: "x"}
		if got, want := d.Validate() == nil, re.MatchString(h); got != want {
			t.Errorf("%q: valid %v, pattern says %v", h, got, want)
		}
	}
}
