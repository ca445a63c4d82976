package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AcquireAll takes the locks of a run on several targets (an Ansible job on
// many hosts) on one dedicated connection: the job lock, then the lock of
// every target, in one global order (the targets sorted, duplicates
// dropped), so that two runs sharing targets never deadlock, and a run on
// one of the targets (a deploy, a provisioning) never overlaps it.
//
// With opts.NoWait every lock is tried at once in one round trip: when any
// target is busy nothing is kept and ErrTargetBusy is returned (the caller
// waits outside its concurrency slots and tries again). Without it the
// targets are waited for one after the other, in order. Errors and Release
// are as for Acquire.
func (lk *Locker) AcquireAll(ctx context.Context, jobID string, targets []string, opts LockOptions) (*RunLocks, error) {
	targets = slices.Clone(targets)
	slices.Sort(targets)
	targets = slices.Compact(targets)
	if len(targets) == 0 {
		return nil, fmt.Errorf("lock job %s: no target", jobID)
	}
	if len(targets) == 1 {
		return lk.Acquire(ctx, jobID, targets[0], opts)
	}
	opts.PingInterval = cmp.Or(max(opts.PingInterval, 0), 5*time.Second)
	opts.PingTimeout = cmp.Or(max(opts.PingTimeout, 0), 5*time.Second)
	opts.WaitSlice = cmp.Or(max(opts.WaitSlice, 0), 2*time.Second)
	keys := make([]int64, len(targets))
	for i, t := range targets {
		keys[i] = TargetLockKey(t)
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
			JobLockKey(jobID), keys, opts.NoWait).Scan(&gotJob, &got)
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
	}
	l := &RunLocks{
		locker: lk, job: jobID, target: strings.Join(targets, " "), conn: conn, pid: conn.PgConn().PID(),
		interval: opts.PingInterval, timeout: opts.PingTimeout,
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
	} else {
		start := time.Now()
		waited := false
		for i, key := range keys {
			var ok bool
			if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
				return fail(fmt.Errorf("lock target %s (job %s): %w", targets[i], jobID, err))
			}
			if ok {
				continue
			}
			if !waited && opts.OnWait != nil {
				opts.OnWait()
			}
			waited = true
			if err := waitAdvisoryLock(ctx, conn, key, opts.WaitSlice); err != nil {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				return fail(fmt.Errorf("wait for lock of target %s (job %s): %w", targets[i], jobID, err))
			}
		}
		if waited {
			l.waited = time.Since(start)
		}
	}
	go l.monitor()
	return l, nil
}

// Busy reports whether a run holds any of targets now: a probe that takes
// the locks of job jobID on them without waiting and gives them back at
// once (two round trips). A caller with work to do before its run (an
// Ansible job's checkout) looks first, so that a job waiting for busy
// hosts does that work once, when they are free, not at every look. A job
// running elsewhere is not busy here: the run's own locking answers it.
func (lk *Locker) Busy(ctx context.Context, jobID string, targets []string) (bool, error) {
	l, err := lk.AcquireAll(ctx, jobID, targets, LockOptions{NoWait: true})
	switch {
	case errors.Is(err, ErrTargetBusy):
		return true, nil
	case errors.Is(err, ErrJobRunningElsewhere):
		return false, nil
	case err != nil:
		return false, err
	}
	return false, l.Release(ctx)
}
