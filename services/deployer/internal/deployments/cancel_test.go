package deployments

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// finishOnCancelKey is a Redis hook: just before the cancel key of jobID
// is set, it runs finish (the job's result arriving at that moment).
type finishOnCancelKey struct {
	jobID  string
	finish func()
}

func (h finishOnCancelKey) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h finishOnCancelKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h finishOnCancelKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "set" && len(args) > 1 && args[1] == messages.CancelKey(messages.JobKindDeploy, h.jobID) {
			h.finish()
		}
		return next(ctx, cmd)
	}
}

// cancelRacing inserts a running deployment, has its result (set by
// finish) recorded at the moment its cancel key is set, as infra would
// publish it, and cancels it.
func cancelRacing(t *testing.T, finish func(r *messages.AnsibleDeployResult)) (db *pgxpool.Pool, id string, d *Deployment, outcome CancelOutcome, err error) {
	t.Helper()
	s, db, rdb, _ := newTestService(t)
	ctx := context.Background()
	row := testRow(s, "", 0)
	if _, err := db.Exec(ctx, insertDeployment, row.args("", 0)...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, state)
		VALUES ($1, 'deploy', 'q', '1-0', 'address:198.51.100.7', 'running')`, row.ID); err != nil {
		t.Fatal(err)
	}
	rdb.AddHook(finishOnCancelKey{jobID: row.ID, finish: func() {
		r := messages.NewAnsibleDeployResult(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: row.ID}}, "1-0")
		finish(r)
		if err := s.Record(ctx, r); err != nil {
			t.Error(err)
		}
	}})
	d, outcome, err = s.Cancel(ctx, AllProjects, row.ID)
	return db, row.ID, d, outcome, err
}

// TestCancelRacesResult: a running deployment whose result is recorded
// while a cancel is being requested answers as finished (409), not as a
// cancel requested, and keeps no cancel request.
func TestCancelRacesResult(t *testing.T) {
	t.Parallel()
	db, id, d, outcome, err := cancelRacing(t, func(r *messages.AnsibleDeployResult) { r.Status = messages.StatusSucceeded })
	if !errors.Is(err, ErrFinished) || d == nil || d.Status != StatusSucceeded || outcome != 0 {
		t.Fatalf("cancel while the result arrives: %+v, %v, %v; want the finished deployment and ErrFinished", d, outcome, err)
	}
	var requested bool
	if err := db.QueryRow(context.Background(), `SELECT cancel_requested_at IS NOT NULL FROM deployments WHERE id = $1`, id).Scan(&requested); err != nil || requested {
		t.Errorf("cancel_requested_at set on a finished deployment (%v)", err)
	}
}

// TestCancelTakesEffectAtOnce: infra sees the cancel key and stops the
// running job before the cancel request is recorded (its cancelled result
// arrives first): the cancel worked, and answers as requested, not as a
// conflict with a finished deployment.
func TestCancelTakesEffectAtOnce(t *testing.T) {
	t.Parallel()
	_, _, d, outcome, err := cancelRacing(t, func(r *messages.AnsibleDeployResult) {
		r.Fail(messages.StatusCancelled, messages.KindCancelled, "cancelled")
	})
	if err != nil || d == nil || d.Status != StatusCancelled || outcome != CancelRequested {
		t.Fatalf("cancel that stopped the job at once: %+v, %v, %v; want the cancelled deployment and CancelRequested", d, outcome, err)
	}
}

// TestCancelledWaiterLeavesItsLines: a queued deployment whose run waits
// in the line of a busy server (infra's store.JoinLines) leaves it when it
// is cancelled, so that the run behind it is first at once, not when the
// cancelled one's place goes stale (store.WaitStale).
func TestCancelledWaiterLeavesItsLines(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	row := testRow(s, "", 0)
	if _, err := db.Exec(ctx, insertDeployment, row.args("", 0)...); err != nil {
		t.Fatal(err)
	}
	target := "address:" + row.ID // a line of its own
	behind := store.Waiter{Job: "behind-" + row.ID, Stream: "q", Entry: "2-0"}
	for _, w := range []store.Waiter{{Job: row.ID, Stream: "q", Entry: "1-0"}, behind} {
		if _, err := store.JoinLines(ctx, db, w, []string{target}); err != nil {
			t.Fatal(err)
		}
	}
	if heads, err := store.LineHeads(ctx, db, []string{target}, ""); err != nil || len(heads) != 1 || heads[0].Job != row.ID {
		t.Fatalf("before the cancel: heads %+v (%v), want the deployment's run", heads, err)
	}
	d, outcome, err := s.Cancel(ctx, AllProjects, row.ID)
	if err != nil || outcome != CancelledBeforeStart || d.Status != StatusCancelled {
		t.Fatalf("cancel: %+v, %v, %v; want cancelled before start", d, outcome, err)
	}
	heads, err := store.LineHeads(ctx, db, []string{target}, "")
	if err != nil || len(heads) != 1 || heads[0] != behind {
		t.Errorf("after the cancel: heads %+v (%v), want only the run behind it, %+v", heads, err, behind)
	}
	if lines, err := store.JobLines(ctx, db, row.ID); err != nil || len(lines) != 0 {
		t.Errorf("the cancelled deployment still waits in %+v (%v)", lines, err)
	}
}
