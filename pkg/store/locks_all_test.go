package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestAcquireAll: a run on several targets holds every one of them; with
// NoWait a busy one makes it keep nothing; waiting, it takes them in order
// and two runs sharing targets in opposite orders both finish.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	lk := store.NewLocker(pool, 2)
	t.Cleanup(lk.Close)

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
	pool := testenv.Pool(t)
	ctx := context.Background()
	lk := store.NewLocker(pool, 2)
	t.Cleanup(lk.Close)
	run, err := lk.Acquire(ctx, "deploy-1", "b-2", store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := lk.Busy(ctx, "job-probe", []string{"b-1", "b-2"}); err != nil || !busy {
		t.Fatalf("Busy with b-2 held = %v, %v; want true", busy, err)
	}
	if busy, err := lk.Busy(ctx, "job-probe", []string{"b-1", "b-3"}); err != nil || busy {
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
	if busy, err := lk.Busy(ctx, "job-probe", []string{"b-2"}); err != nil || busy {
		t.Fatalf("Busy after the run let go = %v, %v; want false", busy, err)
	}
}
