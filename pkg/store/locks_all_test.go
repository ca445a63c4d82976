package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// newLocker returns a test database and a Locker on it keeping two idle
// sessions.
func newLocker(t *testing.T) (*pgxpool.Pool, *store.Locker) {
	pool := testenv.Pool(t)
	lk := store.NewLocker(pool, 2)
	t.Cleanup(lk.Close)
	return pool, lk
}

// TestAcquireAll: a run on several targets holds every one of them; with
// NoWait a busy one makes it keep nothing; waiting, it takes them in order
// and two runs sharing targets in opposite orders both finish.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	pool, lk := newLocker(t)
	ctx := context.Background()

	all, err := lk.AcquireAll(ctx, "job-all", []string{"t-3", "t-1", "t-2", "t-1"}, store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"t-1", "t-2", "t-3"} {
		if rows := advisoryLocks(t, pool, store.TargetLockKey(target)); len(rows) != 1 || rows[0].PID != all.BackendPID() {
			t.Fatalf("%s lock rows = %+v, want the multi-target run's", target, rows)
		}
		// A single-target run (a deploy) on any of them is busy.
		if _, err := lk.Acquire(ctx, "deploy-"+target, target, store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
			t.Fatalf("deploy on %s: %v, want ErrTargetBusy", target, err)
		}
	}
	// Another job sharing one target keeps nothing, its job lock included.
	if _, err := lk.AcquireAll(ctx, "job-other", []string{"t-9", "t-2"}, store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("overlapping job: %v, want ErrTargetBusy", err)
	}
	for _, key := range []int64{store.TargetLockKey("t-9"), store.JobLockKey("job-other")} {
		if rows := advisoryLocks(t, pool, key); len(rows) != 0 {
			t.Fatalf("refused job left a lock: %+v", rows)
		}
	}
	// The same job id elsewhere: running elsewhere.
	if _, err := lk.AcquireAll(ctx, "job-all", []string{"t-7", "t-8"}, store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrJobRunningElsewhere) {
		t.Fatalf("same job: %v, want ErrJobRunningElsewhere", err)
	}

	// Waiting: two jobs on the same targets given in opposite orders both
	// get them once the first holder releases, without deadlock.
	done := make(chan error, 2)
	for _, tc := range []struct {
		job     string
		targets []string
	}{{"job-x", []string{"t-1", "t-3"}}, {"job-y", []string{"t-3", "t-1"}}} {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			l, err := lk.AcquireAll(wctx, tc.job, tc.targets, store.LockOptions{WaitSlice: 100 * time.Millisecond})
			if err == nil {
				time.Sleep(50 * time.Millisecond)
				err = l.Release(ctx)
			}
			done <- err
		}()
	}
	time.Sleep(200 * time.Millisecond)
	if err := all.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("waiting job: %v", err)
		}
	}
}

// TestLockerBusy: the probe says busy while a run holds any of the
// targets, keeps no lock itself, and says free once the run let go.
func TestLockerBusy(t *testing.T) {
	t.Parallel()
	pool, lk := newLocker(t)
	ctx := context.Background()
	run, err := lk.Acquire(ctx, "deploy-1", "b-2", store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "job-probe"}, []string{"b-1", "b-2"}); err != nil || !busy {
		t.Fatalf("Busy with b-2 held = %v, %v; want true", busy, err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "job-probe"}, []string{"b-1", "b-3"}); err != nil || busy {
		t.Fatalf("Busy of free targets = %v, %v; want false", busy, err)
	}
	for _, key := range []int64{store.TargetLockKey("b-1"), store.TargetLockKey("b-3"), store.JobLockKey("job-probe")} {
		if rows := advisoryLocks(t, pool, key); len(rows) != 0 {
			t.Fatalf("the probe kept a lock: %+v", rows)
		}
	}
	if err := run.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "job-probe"}, []string{"b-2"}); err != nil || busy {
		t.Fatalf("Busy after the run let go = %v, %v; want false", busy, err)
	}
}

// TestFreeProbeReserves: a probe that finds its targets free keeps them
// for its job while it prepares: a job probing after it finds them busy
// (and so does a run trying to take them), until the first takes its
// locks or gives its place up (LeaveLines).
func TestFreeProbeReserves(t *testing.T) {
	t.Parallel()
	pool, lk := newLocker(t)
	ctx := context.Background()
	first := store.Waiter{Job: "first", Stream: "q", Entry: "1-0"}
	if busy, err := lk.Busy(ctx, first, []string{"r-1", "r-2"}); err != nil || busy {
		t.Fatalf("first probe = %v, %v; want free", busy, err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "second", Stream: "q", Entry: "2-0"}, []string{"r-2"}); err != nil || !busy {
		t.Fatalf("a probe after a free one = %v, %v; want busy (reserved)", busy, err)
	}
	if _, err := lk.Acquire(ctx, "deploy", "r-1", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("a run on a reserved target = %v, want ErrTargetBusy", err)
	}
	// The first takes its locks: it leaves the lines, and hands over to
	// the second when it ends.
	run, err := lk.AcquireAll(ctx, "first", []string{"r-1", "r-2"}, store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatalf("the reserving job's run: %v", err)
	}
	if lines, err := store.JobLines(ctx, pool, "first"); err != nil || len(lines) != 0 {
		t.Fatalf("lines of the running job = %+v, %v; want none", lines, err)
	}
	if err := run.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A job that reserved and gave up (its checkout failed) holds no one.
	if busy, err := lk.Busy(ctx, first, []string{"r-3"}); err != nil || busy {
		t.Fatalf("probe of r-3 = %v, %v; want free", busy, err)
	}
	if err := store.LeaveLines(ctx, pool, "first"); err != nil {
		t.Fatal(err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "third"}, []string{"r-3"}); err != nil || busy {
		t.Fatalf("a probe after the reservation was given up = %v, %v; want free", busy, err)
	}
}

// TestLinesKeepArrivalOrder: a run needing two targets, one busy, waits in
// the line of both, so a run needing only the free one that arrives later
// waits behind it instead of starving it; where each stands is readable;
// a probe keeps the wide run's place; a waiter that stopped looking loses
// it.
func TestLinesKeepArrivalOrder(t *testing.T) {
	t.Parallel()
	pool, lk := newLocker(t)
	ctx := context.Background()
	noWait := store.LockOptions{NoWait: true}
	behind := map[string]bool{} // what JoinLines said of each waiter
	try := func(job string, targets ...string) (*store.RunLocks, error) {
		l, err := lk.AcquireAll(ctx, job, targets, noWait)
		if errors.Is(err, store.ErrTargetBusy) {
			b, jerr := store.JoinLines(ctx, pool, store.Waiter{Job: job, Stream: "q", Entry: job + "-0"}, targets)
			if jerr != nil {
				t.Fatal(jerr)
			}
			behind[job] = b
		}
		return l, err
	}
	first, err := try("first", "l-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := try("wide", "l-1", "l-2"); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("wide run with l-1 held = %v, want ErrTargetBusy", err)
	}
	if _, err := try("narrow", "l-2"); !errors.Is(err, store.ErrTargetBusy) || !strings.Contains(err.Error(), "job wide waits before it") {
		t.Fatalf("narrow run behind the wide one = %v, want ErrTargetBusy naming it", err)
	}
	if behind["wide"] || !behind["narrow"] {
		t.Errorf("JoinLines said behind = %v, want the wide run first and the narrow one behind", behind)
	}
	lines, err := store.JobLines(ctx, pool, "wide")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].Target != "l-1" || lines[0].Ahead != 0 || !lines[0].Busy ||
		lines[1].Target != "l-2" || lines[1].Ahead != 0 || lines[1].Busy {
		t.Fatalf("wide run's lines = %+v, want first at l-1 (busy) and l-2 (free)", lines)
	}
	if lines, err := store.JobLines(ctx, pool, "narrow"); err != nil || len(lines) != 1 || lines[0].Ahead != 1 {
		t.Fatalf("narrow run's lines = %+v, %v; want one ahead at l-2", lines, err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "wide", Stream: "q", Entry: "wide-0"}, []string{"l-1", "l-2"}); err != nil || !busy {
		t.Fatalf("probe of the wide run = %v, %v; want busy", busy, err)
	}
	// The run that frees l-1 hands over to the wide run, first in both
	// lines; the narrow one behind it is nobody's head.
	for _, targets := range [][]string{{"l-1"}, {"l-2"}, {"l-1", "l-2"}} {
		heads, err := store.LineHeads(ctx, pool, targets, "first")
		if err != nil || len(heads) != 1 || heads[0] != (store.Waiter{Job: "wide", Stream: "q", Entry: "wide-0"}) {
			t.Fatalf("heads of %v = %+v, %v; want the wide run's entry", targets, heads, err)
		}
	}
	if heads, err := store.LineHeads(ctx, pool, []string{"l-2"}, "wide"); err != nil || len(heads) != 1 || heads[0].Job != "narrow" {
		t.Fatalf("heads of l-2 but the wide run = %+v, %v; want the narrow run", heads, err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if busy, err := lk.Busy(ctx, store.Waiter{Job: "wide", Stream: "q", Entry: "wide-0"}, []string{"l-1", "l-2"}); err != nil || busy {
		t.Fatalf("probe of the wide run after l-1 freed = %v, %v; want free", busy, err)
	}
	if _, err := try("narrow", "l-2"); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("narrow run after the probe = %v, want still behind the wide one", err)
	}
	wide, err := try("wide", "l-1", "l-2")
	if err != nil {
		t.Fatalf("wide run at its turn: %v", err)
	}
	if lines, err := store.JobLines(ctx, pool, "wide"); err != nil || len(lines) != 0 {
		t.Fatalf("wide run's lines once it runs = %+v, %v; want none", lines, err)
	}
	if _, err := try("narrow", "l-2"); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("narrow run while the wide one runs = %v, want ErrTargetBusy", err)
	}
	if err := wide.Release(ctx); err != nil {
		t.Fatal(err)
	}
	narrow, err := try("narrow", "l-2")
	if err != nil {
		t.Fatalf("narrow run at its turn: %v", err)
	}
	_ = narrow.Release(ctx)

	// A waiter that stopped looking holds no place.
	if _, err := pool.Exec(ctx, `INSERT INTO run_waits (target, job, seq, seen_at) VALUES ('l-3', 'gone', 0, now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	late, err := try("late", "l-3")
	if err != nil {
		t.Fatalf("run behind a stale waiter: %v", err)
	}
	_ = late.Release(ctx)
}
