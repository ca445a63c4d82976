package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrJobRunningElsewhere: another live session holds the job's lock, so
// another instance runs the job right now; leave the request to it.
var ErrJobRunningElsewhere = errors.New("job is running elsewhere")

// ErrTargetBusy: another run holds the target's lock and the caller asked
// not to wait (LockOptions.NoWait); nothing is held.
var ErrTargetBusy = errors.New("target is busy with another run")

// JobLockKey is the advisory lock key of a job: the first 8 bytes of
// SHA-256("job:"+jobID). A 64-bit key from a strong hash makes collisions
// (which would make an unrelated job look "running elsewhere") negligible.
func JobLockKey(jobID string) int64 { return AdvisoryKey("job:" + jobID) }

// TargetLockKey is the advisory lock key of a run target (a server handle,
// or address:port): the first 8 bytes of SHA-256("target:"+target).
func TargetLockKey(target string) int64 { return AdvisoryKey("target:" + target) }

// AdvisoryKey is the Postgres advisory lock key named name: the first 8
// bytes of its SHA-256.
func AdvisoryKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// LockOptions tune AcquireRunLocks; the zero value is ready to use.
type LockOptions struct {
	// OnWait is called once, before waiting, when another session holds the
	// target lock: the caller can say "waiting for another run on this
	// server".
	OnWait func()
	// PingInterval is how often the lock connection is checked (default
	// 5s); Lost fires at most about PingInterval+PingTimeout after the
	// session died.
	PingInterval time.Duration
	// PingTimeout bounds each check (default 5s).
	PingTimeout time.Duration
	// WaitSlice bounds each wait for the target lock on the server
	// (lock_timeout, default 2s): the wait is a series of such slices until
	// the lock is free or ctx is done. A backend blocked in a lock wait does
	// not read its socket, so when its client dies (kill -9) it would stay
	// queued, holding the job lock, until the target lock freed; with
	// slices it notices within one.
	WaitSlice time.Duration
	// NoWait: when another run holds the target lock, give up at once with
	// ErrTargetBusy (releasing the job lock) instead of waiting; OnWait is
	// not called. A service whose handlers run in a bounded number of slots
	// uses it so that a request for a busy server does not hold a slot.
	NoWait bool
}

// lockNotAvailable is the SQLSTATE of a lock wait that ran into
// lock_timeout.
const lockNotAvailable = "55P03"

// cancelGrace is how long a cancelled query may take to answer the
// server-side cancel before its connection is closed instead.
const cancelGrace = 3 * time.Second

// RunLocks are the two session-level advisory locks of a run, the job lock
// and the target lock, held on a connection of their own (opened from the
// pool's configuration, outside the pool, so a long run never takes a pool
// slot).
//
// The locks live exactly as long as that Postgres session: Release ends
// them; a crashed holder's locks vanish with its connection (Postgres
// releases session locks when the backend ends, also when the client
// process is killed or its connection is terminated); a Postgres restart
// ends them too. Lost tells the holder when that happened behind its back,
// so it stops its play: another instance may take the run over.
type RunLocks struct {
	locker      *Locker
	job, target string
	pid         uint32
	waited      time.Duration
	interval    time.Duration
	timeout     time.Duration

	mu       sync.Mutex // guards conn use, released and lostErr
	conn     *pgx.Conn
	released bool
	lostErr  error

	lost chan struct{}
	stop chan struct{}
	done chan struct{} // closed when the monitor returned
}

// Locker takes run locks (see RunLocks) on dedicated connections, opened
// from a pool's configuration but outside the pool, and keeps up to
// maxIdle of them open between runs: opening one costs a connect and an
// authentication (about 5 ms on loopback), on every run otherwise.
type Locker struct {
	cfg     *pgx.ConnConfig
	maxIdle int
	mu      sync.Mutex
	idle    []*pgx.Conn
	closed  bool
}

// NewLocker returns a Locker for pool's database keeping up to maxIdle lock
// connections open between runs.
func NewLocker(pool *pgxpool.Pool, maxIdle int) *Locker {
	cfg := pool.Config().ConnConfig
	// Cancel a query on the server when its context ends (the default
	// closes the socket instead, and a backend blocked in pg_advisory_lock
	// would not notice: it would stay queued and take the lock later).
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	return &Locker{cfg: cfg, maxIdle: max(maxIdle, 0)}
}

// Close closes the idle lock connections; locks still held are unaffected.
func (lk *Locker) Close() {
	lk.mu.Lock()
	idle := lk.idle
	lk.idle, lk.closed = nil, true
	lk.mu.Unlock()
	for _, c := range idle {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Close(ctx)
		cancel()
	}
}

// conn returns an idle connection (reused reports so) or a new one.
func (lk *Locker) conn(ctx context.Context) (c *pgx.Conn, reused bool, err error) {
	lk.mu.Lock()
	for len(lk.idle) > 0 {
		c = lk.idle[len(lk.idle)-1]
		lk.idle = lk.idle[:len(lk.idle)-1]
		if !c.IsClosed() {
			lk.mu.Unlock()
			return c, true, nil
		}
	}
	lk.mu.Unlock()
	c, err = pgx.ConnectConfig(ctx, lk.cfg)
	return c, false, err
}

// put keeps a connection that holds no locks for the next run, or closes it.
func (lk *Locker) put(c *pgx.Conn) {
	lk.mu.Lock()
	if !lk.closed && !c.IsClosed() && len(lk.idle) < lk.maxIdle {
		lk.idle = append(lk.idle, c)
		lk.mu.Unlock()
		return
	}
	lk.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// AcquireRunLocks takes the locks of a run on a dedicated connection that
// it closes on Release; a service uses a Locker instead, which reuses them.
// See Locker.Acquire.
func AcquireRunLocks(ctx context.Context, pool *pgxpool.Pool, jobID, target string, opts LockOptions) (*RunLocks, error) {
	return NewLocker(pool, 0).Acquire(ctx, jobID, target, opts)
}

// Acquire takes the locks of a run on a dedicated connection:
//
//  1. the job lock (JobLockKey(jobID)), without waiting: when another
//     session holds it, the job runs elsewhere and ErrJobRunningElsewhere
//     is returned at once;
//  2. the target lock (TargetLockKey(target)), waiting for it as long as
//     another run of the same target holds it (opts.OnWait is told), or
//     until ctx is done. A cancelled wait is cancelled on the server and the
//     session's locks are released before the connection closes: nothing
//     stays locked, nothing stays queued.
//
// The caller must Release the locks and should stop its work when Lost
// fires.
func (lk *Locker) Acquire(ctx context.Context, jobID, target string, opts LockOptions) (*RunLocks, error) {
	opts.PingInterval = cmp.Or(max(opts.PingInterval, 0), 5*time.Second)
	opts.PingTimeout = cmp.Or(max(opts.PingTimeout, 0), 5*time.Second)
	opts.WaitSlice = cmp.Or(max(opts.WaitSlice, 0), 2*time.Second)
	// Both locks are tried in one round trip; the target's is only kept
	// when the job's was free.
	var gotJob, gotTarget bool
	var conn *pgx.Conn
	for {
		c, reused, err := lk.conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("lock job %s: connect: %w", jobID, err)
		}
		err = c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1), pg_try_advisory_lock($2)`,
			JobLockKey(jobID), TargetLockKey(target)).Scan(&gotJob, &gotTarget)
		if err == nil {
			conn = c
			break
		}
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Close(closeCtx)
		cancel()
		if !reused || ctx.Err() != nil {
			return nil, fmt.Errorf("lock job %s: %w", jobID, err)
		}
		// An idle connection died meanwhile (Postgres restarted): the
		// try-lock took nothing, so try again on a new one.
	}
	l := &RunLocks{
		locker: lk, job: jobID, target: target, conn: conn, pid: conn.PgConn().PID(),
		interval: opts.PingInterval, timeout: opts.PingTimeout,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	fail := func(err error) (*RunLocks, error) {
		l.abandon()
		return nil, err
	}
	if !gotJob {
		return fail(fmt.Errorf("lock job %s: %w", jobID, ErrJobRunningElsewhere)) // unlocks the target too
	}
	if !gotTarget && opts.NoWait {
		return fail(fmt.Errorf("lock target %s (job %s): %w", target, jobID, ErrTargetBusy))
	}
	if !gotTarget {
		if opts.OnWait != nil {
			opts.OnWait()
		}
		start := time.Now()
		if err := waitAdvisoryLock(ctx, conn, TargetLockKey(target), opts.WaitSlice); err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return fail(fmt.Errorf("wait for lock of target %s (job %s): %w", target, jobID, err))
		}
		l.waited = time.Since(start)
	}
	go l.monitor()
	return l, nil
}

// waitAdvisoryLock takes the session lock key on conn, waiting for it in
// slices of at most slice each (lock_timeout) until it is free or ctx is
// done: the backend never waits longer than a slice without returning to
// its client, so a dead client's backend ends within a slice.
func waitAdvisoryLock(ctx context.Context, conn *pgx.Conn, key int64, slice time.Duration) error {
	if _, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`,
		strconv.FormatInt(max(slice.Milliseconds(), 1), 10)); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	for {
		_, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable || ctx.Err() != nil {
			return err
		}
	}
}

// abandon releases whatever the session holds and closes the connection,
// for a failed acquisition (the monitor is not running).
func (l *RunLocks) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if !l.conn.IsClosed() {
		if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err == nil {
			l.locker.put(l.conn)
			return
		}
	}
	_ = l.conn.Close(ctx)
}

// monitor pings the connection every interval and declares the locks lost
// when a ping fails.
func (l *RunLocks) monitor() {
	defer close(l.done)
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		l.mu.Lock()
		if l.released {
			l.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		err := l.conn.Ping(ctx)
		cancel()
		if err != nil {
			// Whatever failed, the locks can no longer be vouched for: end
			// the session so they are surely gone, and tell the holder.
			l.lostErr = fmt.Errorf("run locks of job %s lost: %w", l.job, err)
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = l.conn.Close(closeCtx)
			cancel()
			close(l.lost)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// Lost is closed when the lock session died (connection killed, Postgres
// restarted, network lost): the locks are gone and another instance may
// take the run over, so the holder must stop its work. Release does not
// close it.
func (l *RunLocks) Lost() <-chan struct{} { return l.lost }

// Err says why the locks were lost; nil while they are held.
func (l *RunLocks) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// Waited is how long AcquireRunLocks waited for the target lock (zero when
// it was free).
func (l *RunLocks) Waited() time.Duration { return l.waited }

// BackendPID is the process id of the lock session's Postgres backend (as
// in pg_locks and pg_stat_activity).
func (l *RunLocks) BackendPID() uint32 { return l.pid }

// Release unlocks both locks and gives the lock connection back to its
// Locker (which keeps it for another run, or closes it). It is idempotent;
// after the locks were lost it only cleans up. When unlocking fails the
// connection is closed, which ends the session and its locks.
func (l *RunLocks) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	close(l.stop)
	wasLost := l.lostErr != nil
	l.mu.Unlock()
	<-l.done
	if wasLost {
		return nil
	}
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = l.conn.Close(closeCtx)
		return fmt.Errorf("release run locks of job %s: %w", l.job, err)
	}
	l.locker.put(l.conn)
	return nil
}
