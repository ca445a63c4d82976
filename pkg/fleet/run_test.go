package fleet_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// recordRun is infra storing a run: RecordRun in its own transaction.
func recordRun(t *testing.T, s *fleet.Store, r fleet.Result, kind fleet.RunKind) bool {
	t.Helper()
	var moved bool
	err := pgx.BeginFunc(context.Background(), s.DB(), func(tx pgx.Tx) (err error) {
		moved, err = s.RecordRun(context.Background(), tx, r, kind, "infra")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return moved
}

// transitions are the server's history rows but the scheduler's own
// events around a job (detected, queued, requested, published): every row
// that says a status changed, or claims a result without a change.
func transitions(t *testing.T, s *fleet.Store, handle string) []string {
	t.Helper()
	return slices.DeleteFunc(events(t, s, handle), func(e string) bool {
		ev, _, _ := strings.Cut(e, " ")
		return slices.Contains([]string{fleet.EventDetected, fleet.EventQueued, fleet.EventRequested, fleet.EventPublished}, ev)
	})
}

// TestOneTransitionPerOutcome: infra makes the transition a run causes,
// with its one history row; the scheduler's ApplyResult then only does its
// bookkeeping (wait cleared, retries, backoff, notification) and adds no
// row, never READY -> READY.
func TestOneTransitionPerOutcome(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	policy := fleet.RetryPolicy{Limit: 2, Backoff: func(int) time.Duration { return time.Minute }, UnreachableCooldown: time.Hour}

	// A provisioning through the scheduler and infra.
	insert(t, b.db, "a", "NEW", nil)
	ja := queueOne(t, s, "a")
	if srv, err := s.StartProvisioning(ctx, "a", ja, "infra"); err != nil || srv.Status != fleet.StatusProvisioning {
		t.Fatalf("start: %+v %v", srv, err)
	}
	if !recordRun(t, s, fleet.Result{Handle: "a", JobID: ja, Status: messages.StatusSucceeded}, fleet.ProvisionRun) {
		t.Fatal("infra's run did not move the server")
	}
	o, srv, err := s.ApplyResult(ctx, fleet.Result{Handle: "a", JobID: ja, Status: messages.StatusSucceeded}, "results", policy)
	if err != nil || o != fleet.Applied || srv.Status != fleet.StatusReady || srv.PendingJobID != "" || srv.Attempts != 0 {
		t.Fatalf("apply: %s %+v %v", o, srv, err)
	}
	if got, want := transitions(t, s, "a"), []string{"result PROVISIONING->READY by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	if n := notifications(t, b.db, "a"); !slices.Equal(n, []string{"READY"}) {
		t.Errorf("notifications %v", n)
	}
	// A redelivered result changes nothing.
	if o, _, _ := s.ApplyResult(ctx, fleet.Result{Handle: "a", JobID: ja, Status: messages.StatusSucceeded}, "results", policy); o != fleet.Duplicate {
		t.Errorf("redelivered: %s", o)
	}
	if got := transitions(t, s, "a"); len(got) != 1 {
		t.Errorf("history after redelivery %q", got)
	}

	// A failure: infra counts the attempt, the scheduler plans the retry
	// from it and does not count it again.
	insert(t, b.db, "f", "NEW", nil)
	jf := queueOne(t, s, "f")
	if _, err := s.StartProvisioning(ctx, "f", jf, "infra"); err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, fleet.Result{Handle: "f", JobID: jf, Status: messages.StatusFailed, Error: "boom"}, fleet.ProvisionRun)
	if srv := mustGet(t, s, "f"); srv.Status != fleet.StatusFailed || srv.Attempts != 1 || srv.LastError != "boom" || srv.LastJobID != jf {
		t.Fatalf("after infra: %+v", srv)
	}
	o, srv, err = s.ApplyResult(ctx, fleet.Result{Handle: "f", JobID: jf, Status: messages.StatusFailed, Error: "boom"}, "results", policy)
	if err != nil || o != fleet.Applied || srv.Attempts != 1 || srv.RetriesExhausted || srv.NextAttemptAt.IsZero() || srv.PendingJobID != "" {
		t.Fatalf("apply failure: %s %+v %v", o, srv, err)
	}
	if got, want := transitions(t, s, "f"), []string{"result PROVISIONING->FAILED by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}

	// Agents publishing to infra directly: no scheduler wait, infra alone
	// leaves the server right; a result the scheduler reads later adds
	// nothing.
	insert(t, b.db, "d", "READY", nil)
	if _, err := s.StartProvisioning(ctx, "d", "direct-1", "infra"); err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, fleet.Result{Handle: "d", JobID: "direct-1", Status: messages.StatusUnreachable, Error: "ssh: timeout"}, fleet.ProvisionRun)
	if srv := mustGet(t, s, "d"); srv.Status != fleet.StatusUnreachable || srv.Attempts != 1 || srv.LastError != "ssh: timeout" {
		t.Fatalf("direct run: %+v", srv)
	}
	if o, _, _ := s.ApplyResult(ctx, fleet.Result{Handle: "d", JobID: "direct-1", Status: messages.StatusUnreachable}, "results", policy); o != fleet.Duplicate {
		t.Errorf("result of a direct run: %s", o)
	}
	want := []string{"transition READY->PROVISIONING by infra", "result PROVISIONING->UNREACHABLE by infra"}
	if got := transitions(t, s, "d"); !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}

	// A deploy that finds a server down marks it UNREACHABLE without an
	// attempt; finding it down again adds no row; a deploy that ran
	// changes nothing.
	insert(t, b.db, "w", "READY", nil)
	if !recordRun(t, s, fleet.Result{Handle: "w", JobID: "dep-1", Status: messages.StatusUnreachable, Error: "down"}, fleet.DeployRun) {
		t.Fatal("deploy did not mark the server")
	}
	if recordRun(t, s, fleet.Result{Handle: "w", JobID: "dep-2", Status: messages.StatusUnreachable, Error: "still down"}, fleet.DeployRun) {
		t.Fatal("UNREACHABLE -> UNREACHABLE counted as a move")
	}
	recordRun(t, s, fleet.Result{Handle: "w", JobID: "dep-3", Status: messages.StatusFailed}, fleet.DeployRun)
	if srv := mustGet(t, s, "w"); srv.Status != fleet.StatusUnreachable || srv.Attempts != 0 || srv.LastError != "still down" || srv.LastJobID != "dep-2" {
		t.Errorf("after deploys: %+v", srv)
	}
	if got, want := transitions(t, s, "w"), []string{"result READY->UNREACHABLE by infra"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}

	// An ORPHANED server keeps its status and remembers the outcome.
	insert(t, b.db, "o", "ORPHANED", nil)
	if srv, err := s.StartProvisioning(ctx, "o", "direct-2", "infra"); err != nil || srv.Status != fleet.StatusOrphaned {
		t.Fatalf("start on orphaned: %+v %v", srv, err)
	}
	recordRun(t, s, fleet.Result{Handle: "o", JobID: "direct-2", Status: messages.StatusSucceeded}, fleet.ProvisionRun)
	if srv := mustGet(t, s, "o"); srv.Status != fleet.StatusOrphaned || srv.OrphanedFrom != fleet.StatusReady {
		t.Errorf("orphaned: %+v", srv)
	}
}

// TestApplyResultWithoutInfraRecord: a result infra published without a
// run (a refused target) is the scheduler's to apply: one row, by it.
func TestApplyResultWithoutInfraRecord(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "r", "NEW", nil)
	jr := queueOne(t, s, "r")
	o, srv, err := s.ApplyResult(ctx, fleet.Result{Handle: "r", JobID: jr, Status: messages.StatusRejected, Error: "target refused"}, "results", fleet.RetryPolicy{Limit: 3})
	if err != nil || o != fleet.Applied || srv.Status != fleet.StatusFailed || srv.Attempts != 1 || !srv.RetriesExhausted {
		t.Fatalf("apply: %s %+v %v", o, srv, err)
	}
	if got, want := transitions(t, s, "r"), []string{"result PROVISIONING->FAILED by results"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
}
