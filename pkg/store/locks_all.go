package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AcquireAll takes the locks of a run on its targets (one for a deploy or
// a provisioning, many for an Ansible job) on one dedicated connection:
// the job lock without waiting (when another session holds it, the job
// runs elsewhere and ErrJobRunningElsewhere is returned at once), then the
// lock of every target, in one global order (the targets sorted,
// duplicates dropped), so that two runs sharing targets never deadlock,
// and then a lease on each (see RunLocks).
//
// With opts.NoWait every lock is tried at once in one round trip: when any
// target is busy nothing is kept and ErrTargetBusy is returned (the caller
// waits outside its concurrency slots and tries again). Without it the
// targets are waited for one after the other, in order, opts.OnWait told
// once, until they are free or ctx is done. A cancelled wait is cancelled
// on the server and the session's locks are released before the
// connection is reused or closed: nothing stays locked, nothing stays
// queued.
//
// The caller must Release the locks and should stop its work when Lost
// fires.
func (lk *Locker) AcquireAll(ctx context.Context, jobID string, targets []string, opts LockOptions) (*RunLocks, error) {
	targets = slices.Clone(targets)
	slices.Sort(targets)
	targets = slices.Compact(targets)
	if len(targets) == 0 {
		return nil, fmt.Errorf("lock job %s: no target", jobID)
	}
	opts = opts.withDefaults()
	keys := make([]int64, 0, len(targets)+1)
	keys = append(keys, JobLockKey(jobID))
	for _, t := range targets {
		keys = append(keys, TargetLockKey(t))
	}
	var gotJob bool
	var got []bool
	var conn *pgx.Conn
	for {
		c, reused, err := lk.conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("lock job %s: connect: %w", jobID, err)
		}
		// The job's lock first; the targets' only when it was free (the
		// CASE keeps them untried otherwise), in the order of keys.
		err = c.QueryRow(ctx, `
			SELECT j.ok, CASE WHEN j.ok AND $3 THEN
				ARRAY(SELECT pg_try_advisory_lock(k) FROM unnest($2::bigint[]) WITH ORDINALITY AS t(k, i) ORDER BY i)
			ELSE '{}'::boolean[] END
			FROM (SELECT pg_try_advisory_lock($1) AS ok) j`,
			keys[0], keys[1:], opts.NoWait).Scan(&gotJob, &got)
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
		locker: lk, job: jobID, target: strings.Join(targets, " "), keys: keys, holder: newHolderID(),
		conn: conn, pid: conn.PgConn().PID(),
		interval: opts.PingInterval, timeout: opts.PingTimeout, lease: opts.Lease,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	fail := func(err error) (*RunLocks, error) {
		l.abandon()
		return nil, err
	}
	if !gotJob {
		return fail(fmt.Errorf("lock job %s: %w", jobID, ErrJobRunningElsewhere))
	}
	if opts.NoWait {
		for i, ok := range got {
			if !ok {
				return fail(fmt.Errorf("lock target %s (job %s): %w", targets[i], jobID, ErrTargetBusy))
			}
		}
		// Free, but not this run's turn while a run that came first waits
		// for one of the targets (JoinLines).
		ahead, err := aheadInLine(ctx, conn, jobID, targets)
		if err != nil {
			return fail(fmt.Errorf("lock targets %s (job %s): read their lines: %w", l.target, jobID, err))
		}
		if ahead != "" {
			return fail(fmt.Errorf("lock targets %s (job %s): job %s waits before it: %w", l.target, jobID, ahead, ErrTargetBusy))
		}
	}
	start := time.Now()
	waited := false
	onWait := func() {
		if !waited && opts.OnWait != nil {
			opts.OnWait()
		}
		waited = true
	}
	for {
		if !opts.NoWait {
			for i, key := range keys[1:] {
				var ok bool
				if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
					return fail(fmt.Errorf("lock target %s (job %s): %w", targets[i], jobID, err))
				}
				if ok {
					continue
				}
				onWait()
				if err := waitAdvisoryLock(ctx, conn, key, opts.WaitSlice); err != nil {
					if ctx.Err() != nil {
						err = ctx.Err()
					}
					return fail(fmt.Errorf("wait for lock of target %s (job %s): %w", targets[i], jobID, err))
				}
			}
		}
		claimed, err := l.claim(ctx, !opts.probe)
		if err != nil {
			return fail(fmt.Errorf("lease the locks of job %s: %w", jobID, err))
		}
		if len(claimed) == len(keys) {
			break
		}
		// A lease written before a Postgres restart still stands: its
		// holder may still run and will renew it.
		if !slices.Contains(claimed, keys[0]) {
			return fail(fmt.Errorf("lock job %s (leased across a Postgres restart): %w", jobID, ErrJobRunningElsewhere))
		}
		if opts.NoWait {
			return fail(fmt.Errorf("lock targets %s (job %s, leased across a Postgres restart): %w", l.target, jobID, ErrTargetBusy))
		}
		onWait()
		// Give the targets back so that their holder can take them again,
		// and look once more after a slice.
		if _, err := conn.Exec(ctx, `
			WITH gone AS (DELETE FROM run_leases WHERE key = ANY($1) AND holder = $2)
			SELECT pg_advisory_unlock(k) FROM unnest($1::bigint[]) AS k`, keys[1:], l.holder); err != nil {
			return fail(fmt.Errorf("lock targets %s (job %s): %w", l.target, jobID, err))
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("wait for lease of targets %s (job %s): %w", l.target, jobID, ctx.Err()))
		case <-time.After(opts.WaitSlice):
		}
	}
	if waited {
		l.waited = time.Since(start)
	}
	go l.monitor()
	return l, nil
}

// newHolderID returns a random id for a RunLocks, its fencing token in
// run_leases.
func newHolderID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// claim writes the leases of every key on the lock connection, which holds
// their advisory locks, and returns the keys it got. A key's lease is
// taken when it is this holder's, when it expired, or when it was written
// in this Postgres's lifetime (its epoch): holding the advisory lock now
// proves its writer's session ended since. A lease from before a restart
// that has not expired is left to its holder.
//
// A run that takes its locks (leave) leaves the lines it waited in.
func (l *RunLocks) claim(ctx context.Context, leave bool) ([]int64, error) {
	l.renewedStart = time.Now()
	var claimed []int64
	err := l.conn.QueryRow(ctx, `
		WITH claimed AS (
			INSERT INTO run_leases AS r (key, holder, job, epoch, expires_at)
			SELECT k, $2, $3, pg_postmaster_start_time(), now() + make_interval(secs => $4)
			FROM unnest($1::bigint[]) AS k
			ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, job = excluded.job,
				epoch = excluded.epoch, expires_at = excluded.expires_at
			WHERE r.holder = excluded.holder OR r.epoch = excluded.epoch OR r.expires_at < now()
			RETURNING key),
		left_lines AS (DELETE FROM run_waits WHERE job = $3 AND $5)
		SELECT coalesce(array_agg(key), '{}') FROM claimed`,
		l.keys, l.holder, l.job, l.lease.Seconds(), leave).Scan(&claimed)
	return claimed, err
}

// Busy reports whether a run holds any of targets now: a probe that takes
// the locks of job w.Job on them without waiting and gives them back at
// once. A caller with work to do before its run (an Ansible job's
// checkout) looks first, so that a job waiting for busy hosts does that
// work once, when they are free, not at every look. A job running
// elsewhere is not busy here: the run's own locking answers it. A target
// is busy too while a run that came first waits for it (JoinLines).
//
// A probe that finds the targets free reserves them: while it holds their
// locks, w joins their lines (or keeps its place there), so a job probing
// after it finds it ahead and waits instead of preparing too, only to
// find the targets taken when its preparation is done. The run leaves the
// lines when it takes its locks; a job that ends before its run leaves
// them with LeaveLines (or its place goes stale after WaitStale).
func (lk *Locker) Busy(ctx context.Context, w Waiter, targets []string) (bool, error) {
	l, err := lk.AcquireAll(ctx, w.Job, targets, LockOptions{NoWait: true, probe: true})
	switch {
	case errors.Is(err, ErrTargetBusy):
		return true, nil
	case errors.Is(err, ErrJobRunningElsewhere):
		return false, nil
	case err != nil:
		return false, err
	}
	l.mu.Lock()
	_, jerr := JoinLines(ctx, l.conn, w, targets) // on the locks' connection, while they are held
	l.mu.Unlock()
	return false, errors.Join(jerr, l.Release(ctx))
}
