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
	// PingInterval is how often the holder renews its leases (default 5s),
	// which also checks that its lock session lives.
	PingInterval time.Duration
	// PingTimeout bounds each renewal and each reconnect (default 5s).
	PingTimeout time.Duration
	// Lease is how long the locks outlive a lock session that Postgres
	// ended by restarting (default 60s): nobody else takes them meanwhile,
	// and the holder renews them when Postgres is back, so its play goes on.
	// Lost fires when the lease ran out before Postgres came back, or when
	// someone else holds the locks by then. Keep it below the time Postgres
	// takes to notice a vanished client (its TCP keepalive, hours by
	// default), or a partitioned holder could outlive its session.
	Lease time.Duration
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

	// probe: a look that gives the locks back at once (Busy); the job
	// keeps its place in its targets' lines.
	probe bool
}

// withDefaults fills in the zero fields of o.
func (o LockOptions) withDefaults() LockOptions {
	o.PingInterval = cmp.Or(max(o.PingInterval, 0), 5*time.Second)
	o.PingTimeout = cmp.Or(max(o.PingTimeout, 0), 5*time.Second)
	o.Lease = cmp.Or(max(o.Lease, 0), 60*time.Second)
	o.WaitSlice = cmp.Or(max(o.WaitSlice, 0), 2*time.Second)
	return o
}

// lockNotAvailable is the SQLSTATE of a lock wait that ran into
// lock_timeout.
const lockNotAvailable = "55P03"

// cancelGrace is how long a cancelled query may take to answer the
// server-side cancel before its connection is closed instead.
const cancelGrace = 3 * time.Second

// RunLocks are the session-level advisory locks of a run, the job lock and
// the lock of each target, held on a connection of their own (opened from
// the pool's configuration, outside the pool, so a long run never takes a
// pool slot), each with a lease row in run_leases.
//
// The advisory locks exclude other live sessions; the leases carry the
// locks across a Postgres restart, which ends every session: nobody takes
// a key whose lease, written before the restart, still stands, and the
// holder reconnects, takes its advisory locks again and renews the leases
// (the holder's id is the fencing token: a renewal only counts when the
// rows are still its own). Release deletes the leases and ends the locks.
// A crashed holder's advisory locks vanish with its connection, and since
// Postgres kept running, its leases are taken at once by the next run.
// Lost tells the holder when the locks could not be kept (the lease ran
// out before Postgres came back, or another run took them), so it stops
// its play: another instance may take the run over.
type RunLocks struct {
	locker       *Locker
	job, target  string
	keys         []int64 // the job's key first, then the targets'
	holder       string  // this holder's id in run_leases
	waited       time.Duration
	interval     time.Duration
	timeout      time.Duration
	lease        time.Duration
	renewedStart time.Time // when the last renewal that held was sent

	mu       sync.Mutex // guards conn use, pid, released and lostErr
	conn     *pgx.Conn
	pid      uint32
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

// Acquire takes the locks of a run on one target; see AcquireAll.
func (lk *Locker) Acquire(ctx context.Context, jobID, target string, opts LockOptions) (*RunLocks, error) {
	return lk.AcquireAll(ctx, jobID, []string{target}, opts)
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
