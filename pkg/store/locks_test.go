package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The test binary doubles as a lock-holding child process (see
// TestRunLocksDieWithTheirProcess).
const (
	childDSNEnv    = "STORE_LOCK_CHILD_DSN"
	childJobEnv    = "STORE_LOCK_CHILD_JOB"
	childTargetEnv = "STORE_LOCK_CHILD_TARGET"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(childDSNEnv); dsn != "" {
		os.Exit(lockChild(dsn, os.Getenv(childJobEnv), os.Getenv(childTargetEnv)))
	}
	os.Exit(m.Run())
}

// lockChild takes the run locks, says so on stdout and holds them until it
// is killed.
func lockChild(dsn, job, target string) int {
	ctx := context.Background()
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := store.AcquireRunLocks(ctx, pool, job, target, store.LockOptions{
		OnWait: func() { fmt.Println("waiting") },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	fmt.Printf("locked %d\n", l.BackendPID())
	select {}
}

// advisoryLock is a row of pg_locks for an advisory lock.
type advisoryLock struct {
	PID     uint32
	Granted bool
}

// advisoryLocks lists the sessions holding or waiting for the advisory lock
// key in the pool's database.
func advisoryLocks(t *testing.T, pool *pgxpool.Pool, key int64) []advisoryLock {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT pid, granted FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND classid = $1 AND objid = $2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY granted DESC, pid`, uint32(uint64(key)>>32), uint32(uint64(key)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []advisoryLock
	for rows.Next() {
		var l advisoryLock
		var pid int32
		if err := rows.Scan(&pid, &l.Granted); err != nil {
			t.Fatal(err)
		}
		l.PID = uint32(pid)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func acquire(t *testing.T, pool *pgxpool.Pool, job, target string, opts store.LockOptions) *store.RunLocks {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := store.AcquireRunLocks(ctx, pool, job, target, opts)
	if err != nil {
		t.Fatalf("acquire locks of %s on %s: %v", job, target, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

func TestLockKeys(t *testing.T) {
	t.Parallel()
	// Stable, prefixed, 64 bits: a job and a target of the same name differ.
	if store.JobLockKey("x") == store.TargetLockKey("x") || store.JobLockKey("a") == store.JobLockKey("b") {
		t.Fatal("lock keys collide")
	}
	// Instances of every version must agree on the keys: they are pinned
	// to their definition, SHA-256 of the prefixed name, first 8 bytes.
	for name, got := range map[string]int64{"job:job-1": store.JobLockKey("job-1"), "target:server:web-1": store.TargetLockKey("server:web-1")} {
		sum := sha256.Sum256([]byte(name))
		if want := int64(binary.BigEndian.Uint64(sum[:8])); got != want {
			t.Errorf("key of %s = %x, want %x", name, got, want)
		}
	}
	if k := store.JobLockKey("job-1"); k>>32 == 0 {
		t.Fatalf("key %x uses only 32 bits", k)
	}
}

func TestJobLockRunningElsewhere(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	a := acquire(t, pool, "job-1", "web-1", store.LockOptions{})
	if a.Waited() != 0 {
		t.Fatalf("free locks waited %s", a.Waited())
	}
	held := advisoryLocks(t, pool, store.JobLockKey("job-1"))
	if len(held) != 1 || !held[0].Granted || held[0].PID != a.BackendPID() {
		t.Fatalf("job lock rows = %+v, want granted to pid %d", held, a.BackendPID())
	}

	// Another session (another instance) asking for the same job is told at
	// once, even for another target, and holds nothing afterwards.
	waitCalled := false
	_, err := store.AcquireRunLocks(ctx, pool, "job-1", "web-2", store.LockOptions{OnWait: func() { waitCalled = true }})
	if !errors.Is(err, store.ErrJobRunningElsewhere) || waitCalled {
		t.Fatalf("second session: err = %v (waited %v), want ErrJobRunningElsewhere at once", err, waitCalled)
	}
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-2")); len(rows) != 0 {
		t.Fatalf("refused session left target locks: %+v", rows)
	}

	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	// Release is synchronous: the locks are free when it returns.
	if rows := advisoryLocks(t, pool, store.JobLockKey("job-1")); len(rows) != 0 {
		t.Fatalf("job lock after release: %+v", rows)
	}
	b := acquire(t, pool, "job-1", "web-2", store.LockOptions{})
	select {
	case <-b.Lost():
		t.Fatal("fresh locks lost")
	default:
	}
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
}

// With NoWait, a run of a busy target is refused at once with
// ErrTargetBusy and holds nothing afterwards (its job lock included); once
// the target is free, it gets both locks.
func TestNoWaitOnBusyTarget(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	a := acquire(t, pool, "job-a", "web-1", store.LockOptions{})
	waitCalled := false
	_, err := store.AcquireRunLocks(ctx, pool, "job-b", "web-1", store.LockOptions{NoWait: true, OnWait: func() { waitCalled = true }})
	if !errors.Is(err, store.ErrTargetBusy) || waitCalled {
		t.Fatalf("err = %v (OnWait called %v), want ErrTargetBusy at once", err, waitCalled)
	}
	if rows := advisoryLocks(t, pool, store.JobLockKey("job-b")); len(rows) != 0 {
		t.Fatalf("refused run left its job lock: %+v", rows)
	}
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-1")); len(rows) != 1 || rows[0].PID != a.BackendPID() {
		t.Fatalf("target lock rows = %+v, want only the holder's", rows)
	}
	// A free target is taken as without NoWait.
	c := acquire(t, pool, "job-c", "web-2", store.LockOptions{NoWait: true})
	if c.Waited() != 0 {
		t.Fatalf("free target waited %s", c.Waited())
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	acquire(t, pool, "job-b", "web-1", store.LockOptions{NoWait: true})
}

func TestTargetLockSerialisesRuns(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	first := acquire(t, pool, "job-1", "web-1", store.LockOptions{})

	waiting := make(chan struct{})
	type acquired struct {
		l   *store.RunLocks
		at  time.Time
		err error
	}
	second := make(chan acquired, 1)
	go func() {
		l, err := store.AcquireRunLocks(context.Background(), pool, "job-2", "web-1",
			store.LockOptions{OnWait: func() { close(waiting) }})
		second <- acquired{l, time.Now(), err}
	}()
	<-waiting
	// The second run is queued behind the first in Postgres.
	target := store.TargetLockKey("web-1")
	testenv.WaitFor(t, 10*time.Second, "second run queued for the target lock", func() bool {
		rows := advisoryLocks(t, pool, target)
		return len(rows) == 2 && rows[0].Granted && rows[0].PID == first.BackendPID() && !rows[1].Granted
	})
	select {
	case r := <-second:
		t.Fatalf("second run got the target while the first holds it (err %v)", r.err)
	default:
	}

	releasedAt := time.Now()
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	var r acquired
	select {
	case r = <-second:
	case <-time.After(30 * time.Second):
		t.Fatal("second run still waiting after the first released")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release(context.Background())
	if r.at.Before(releasedAt) {
		t.Fatalf("second run acquired at %v, before the first released at %v", r.at, releasedAt)
	}
	if r.l.Waited() <= 0 {
		t.Fatalf("second run's Waited = %s", r.l.Waited())
	}
	rows := advisoryLocks(t, pool, target)
	if len(rows) != 1 || !rows[0].Granted || rows[0].PID != r.l.BackendPID() {
		t.Fatalf("target lock rows = %+v, want granted to the second run (pid %d)", rows, r.l.BackendPID())
	}
}

func TestCancelledWaitLeavesNoLock(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	holder := acquire(t, pool, "job-1", "web-1", store.LockOptions{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		l, err := store.AcquireRunLocks(ctx, pool, "job-2", "web-1", store.LockOptions{OnWait: func() { close(waiting) }})
		if err == nil {
			_ = l.Release(context.Background())
		}
		done <- err
	}()
	<-waiting
	target := store.TargetLockKey("web-1")
	testenv.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return len(advisoryLocks(t, pool, target)) == 2 })
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled wait did not return")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: err = %v, want context.Canceled", err)
	}
	// Nothing of the waiter is left: not its job lock, not a queued request.
	if rows := advisoryLocks(t, pool, store.JobLockKey("job-2")); len(rows) != 0 {
		t.Fatalf("job lock of the cancelled waiter: %+v", rows)
	}
	if rows := advisoryLocks(t, pool, target); len(rows) != 1 || rows[0].PID != holder.BackendPID() {
		t.Fatalf("target lock rows after cancel = %+v, want only the holder (pid %d)", rows, holder.BackendPID())
	}
	// And once the holder is done, the target is immediately free for others.
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	tryCtx, tryCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer tryCancel()
	third, err := store.AcquireRunLocks(tryCtx, pool, "job-2", "web-1", store.LockOptions{
		OnWait: func() { t.Error("target still locked after the holder released and the waiter was cancelled") },
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = third.Release(context.Background())
}

// A lock session that ends while Postgres keeps running (a dropped
// connection) costs the holder nothing when no one took its leases: it
// takes its locks again on a new session, and nobody else gets them.
func TestTerminatedSessionKeepsItsLocks(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	a := acquire(t, pool, "job-1", "web-1", store.LockOptions{PingInterval: 100 * time.Millisecond})
	defer a.Release(ctx)
	old := a.BackendPID()

	var killed bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(old)).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate lock session: %v %v", killed, err)
	}
	testenv.WaitFor(t, 15*time.Second, "the locks held again on a new session", func() bool {
		rows := advisoryLocks(t, pool, store.TargetLockKey("web-1"))
		return a.BackendPID() != old && len(rows) == 1 && rows[0].Granted && rows[0].PID == a.BackendPID()
	})
	select {
	case <-a.Lost():
		t.Fatalf("Lost fired: %v", a.Err())
	default:
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-1", "web-1", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrJobRunningElsewhere) {
		t.Fatalf("second acquisition = %v, want ErrJobRunningElsewhere", err)
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-2", "web-1", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("other job's acquisition = %v, want ErrTargetBusy", err)
	}
}

// When another run holds the leases by the time the holder reconnects (it
// took them while the holder's session was gone), the holder's locks are
// lost: its fencing token no longer matches.
func TestTakenLeaseLosesLocks(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	a := acquire(t, pool, "job-1", "web-1", store.LockOptions{PingInterval: 100 * time.Millisecond})

	if _, err := pool.Exec(ctx, `UPDATE run_leases SET holder = 'someone-else' WHERE job = 'job-1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(a.BackendPID())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(15 * time.Second):
		t.Fatal("Lost did not fire after another run took the leases")
	}
	if err := a.Err(); err == nil || !strings.Contains(err.Error(), "another run holds the leases") {
		t.Fatalf("Err = %v, want the leases taken", err)
	}
	if err := a.Release(ctx); err != nil { // cleaning up after a loss is fine
		t.Fatal(err)
	}
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-1")); len(rows) != 0 {
		t.Fatalf("target lock rows = %+v, want none after the loss", rows)
	}
}

// A lease written before a Postgres restart holds its keys until it
// expires: the next run waits for it (its holder might still run), then
// takes it.
func TestLeaseFromBeforeARestartStandsUntilItExpires(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	// expires is the target's old lease's end (the job's, written a moment
	// later on a loaded machine, may end after the target is taken).
	var expires time.Time
	for i, k := range []struct {
		key int64
		job string
	}{{store.TargetLockKey("web-9"), "job-old"}, {store.JobLockKey("job-9"), "job-9"}} {
		var end time.Time
		if err := pool.QueryRow(ctx, `
			INSERT INTO run_leases (key, holder, job, epoch, expires_at)
			VALUES ($1, 'before-the-restart', $2, '2000-01-01', now() + interval '3 seconds')
			RETURNING expires_at`, k.key, k.job).Scan(&end); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			expires = end
		}
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-1", "web-9", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("acquisition of a leased target = %v, want ErrTargetBusy", err)
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-9", "web-8", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrJobRunningElsewhere) {
		t.Fatalf("acquisition of a leased job = %v, want ErrJobRunningElsewhere", err)
	}
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-9")); len(rows) != 0 {
		t.Fatalf("target lock rows = %+v, want none kept by the refused runs", rows)
	}
	waited := false
	l := acquire(t, pool, "job-1", "web-9", store.LockOptions{WaitSlice: 200 * time.Millisecond, OnWait: func() { waited = true }})
	defer l.Release(ctx)
	// Measured on the server's clock, which set both leases: a loaded
	// machine may take a good part of the old lease before the wait
	// begins. The new lease was claimed at its expiry less the default
	// lease (60s).
	var afterExpiry bool
	if err := pool.QueryRow(ctx, `SELECT expires_at - interval '60 seconds' >= $1 FROM run_leases WHERE key = $2`,
		expires, store.TargetLockKey("web-9")).Scan(&afterExpiry); err != nil {
		t.Fatal(err)
	}
	if !waited || l.Waited() <= 0 || !afterExpiry {
		t.Errorf("waited %v (told %v, taken after the lease expired: %v), want a wait until the lease expired",
			l.Waited(), waited, afterExpiry)
	}
}

// A Postgres restart (every session ended, nothing answering for seconds)
// does not cost a run its locks: nobody takes them meanwhile, and the
// holder takes them again when Postgres is back. An outage longer than the
// lease does.
func TestPostgresRestartKeepsLocks(t *testing.T) {
	pg := testenv.StartPostgresServer(t)
	ctx := context.Background()
	pool, err := store.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	opts := store.LockOptions{PingInterval: 200 * time.Millisecond, PingTimeout: time.Second}
	long, short := opts, opts
	long.Lease, short.Lease = 30*time.Second, 3*time.Second
	a := acquire(t, pool, "job-1", "web-1", long)
	defer a.Release(ctx)
	b := acquire(t, pool, "job-2", "web-2", short)
	defer b.Release(ctx)

	pg.Stop()
	time.Sleep(5 * time.Second) // longer than b's lease
	pg.Start()

	select {
	case <-b.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the run whose lease ran out did not lose its locks")
	}
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "ran out") {
		t.Errorf("Err = %v, want the lease ran out", err)
	}
	testenv.WaitFor(t, 15*time.Second, "the locks held again after the restart", func() bool {
		rows := advisoryLocks(t, pool, store.TargetLockKey("web-1"))
		return len(rows) == 1 && rows[0].Granted && rows[0].PID == a.BackendPID()
	})
	select {
	case <-a.Lost():
		t.Fatalf("the run within its lease lost its locks: %v", a.Err())
	default:
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-3", "web-1", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("acquisition of the held target = %v, want ErrTargetBusy", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c := acquire(t, pool, "job-3", "web-1", store.LockOptions{NoWait: true})
	defer c.Release(ctx)
}

func TestRunLocksDieWithTheirProcess(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := testenv.StartBinary(t, exe, testenv.BinaryEnv(
		childDSNEnv+"="+dsn, childJobEnv+"=job-1", childTargetEnv+"=web-1"))
	var pid uint32
	testenv.WaitFor(t, 30*time.Second, "child holds the locks", func() bool {
		select {
		case <-child.Exited():
			t.Fatalf("child exited: %s", child.Stderr())
		default:
		}
		_, err := fmt.Sscanf(strings.TrimSpace(child.Stdout()), "locked %d", &pid)
		return err == nil
	})
	for _, key := range []int64{store.JobLockKey("job-1"), store.TargetLockKey("web-1")} {
		if rows := advisoryLocks(t, pool, key); len(rows) != 1 || rows[0].PID != pid || !rows[0].Granted {
			t.Fatalf("lock %x rows = %+v, want granted to the child's session %d", key, rows, pid)
		}
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-1", "web-1", store.LockOptions{}); !errors.Is(err, store.ErrJobRunningElsewhere) {
		t.Fatalf("while the child holds the job: err = %v, want ErrJobRunningElsewhere", err)
	}

	child.Signal(syscall.SIGKILL)
	child.Wait(10 * time.Second)
	testenv.WaitFor(t, 15*time.Second, "locks released after the holder was killed", func() bool {
		l, err := store.AcquireRunLocks(ctx, pool, "job-1", "web-1", store.LockOptions{
			OnWait: func() { t.Error("target lock outlived its killed holder") },
		})
		if errors.Is(err, store.ErrJobRunningElsewhere) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
		return true
	})
}

// A process killed while it waits for a busy target leaves no lock behind:
// its backend, blocked in the lock wait, does not read its socket, but the
// wait is sliced (lock_timeout), so it notices the dead client within a
// slice and its job lock frees although the target stays busy.
func TestKilledWaiterLeavesNoJobLock(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	busy := acquire(t, pool, "job-busy", "web-1", store.LockOptions{})
	defer busy.Release(ctx)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := testenv.StartBinary(t, exe, testenv.BinaryEnv(
		childDSNEnv+"="+dsn, childJobEnv+"=job-1", childTargetEnv+"=web-1"))
	testenv.WaitFor(t, 30*time.Second, "child waits for the busy target", func() bool {
		select {
		case <-child.Exited():
			t.Fatalf("child exited: %s", child.Stderr())
		default:
		}
		return strings.Contains(child.Stdout(), "waiting")
	})
	if rows := advisoryLocks(t, pool, store.JobLockKey("job-1")); len(rows) != 1 || !rows[0].Granted {
		t.Fatalf("job lock rows = %+v, want granted to the waiting child", rows)
	}
	child.Signal(syscall.SIGKILL)
	child.Wait(10 * time.Second)
	testenv.WaitFor(t, 15*time.Second, "the killed waiter's job lock to free while the target is busy", func() bool {
		return len(advisoryLocks(t, pool, store.JobLockKey("job-1"))) == 0
	})
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-1")); len(rows) != 1 || rows[0].PID != busy.BackendPID() {
		t.Errorf("target lock rows = %+v, want only the busy run's session %d", rows, busy.BackendPID())
	}
}

// A Locker keeps released lock sessions for the next run, and replaces one
// that died while idle.
func TestLockerReusesSessions(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	lk := store.NewLocker(pool, 2)
	defer lk.Close()

	first, err := lk.Acquire(ctx, "job-1", "server:web-1", store.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := first.BackendPID()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := lk.Acquire(ctx, "job-2", "server:web-1", store.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if second.BackendPID() != pid {
		t.Errorf("second run got backend %d, want the reused %d", second.BackendPID(), pid)
	}
	// The reused session holds the new locks and nothing of the old ones.
	var held []int64
	rows, err := pool.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND granted`, pid)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k int64
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		held = append(held, k)
	}
	rows.Close()
	if len(held) != 2 {
		t.Errorf("reused session holds %d advisory locks, want 2 (job-2 and its target)", len(held))
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The idle session dies (Postgres restart, idle timeout): the next
	// Acquire notices and opens a new one.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	third, err := lk.Acquire(ctx, "job-3", "server:web-1", store.LockOptions{})
	if err != nil {
		t.Fatalf("acquire after the idle session died: %v", err)
	}
	if third.BackendPID() == pid {
		t.Error("a dead session was used again")
	}
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A renewal that takes longer than its timeout (a loaded database, a
// lease row locked for a while) does not cost the run its locks while
// the lock session lives: ending the session would free the target for
// another run while this one's play goes on.
func TestSlowRenewalKeepsTheLocks(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	a := acquire(t, pool, "job-slow-1", "web-slow", store.LockOptions{PingInterval: 100 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	pid := a.BackendPID()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM run_leases WHERE key = $1 FOR UPDATE`, store.TargetLockKey("web-slow")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // several renewals time out
	rows := advisoryLocks(t, pool, store.TargetLockKey("web-slow"))
	if len(rows) != 1 || !rows[0].Granted || rows[0].PID != pid {
		t.Fatalf("target lock rows %+v while renewals were slow, want the holder's session %d still holding it", rows, pid)
	}
	if _, err := store.AcquireRunLocks(ctx, pool, "job-slow-2", "web-slow", store.LockOptions{NoWait: true}); !errors.Is(err, store.ErrTargetBusy) {
		t.Fatalf("another run's acquisition while renewals were slow = %v, want ErrTargetBusy", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // renewals go through again
	select {
	case <-a.Lost():
		t.Fatalf("locks lost: %v", a.Err())
	default:
	}
	if rows := advisoryLocks(t, pool, store.TargetLockKey("web-slow")); len(rows) != 1 || rows[0].PID != pid {
		t.Errorf("target lock rows %+v after the slow renewals, want session %d", rows, pid)
	}
}
