package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// errLeaseTaken: the holder's leases are no longer all its own: another
// run took them (it expired, or the holder's session ended while Postgres
// kept running).
var errLeaseTaken = errors.New("another run holds the leases")

// reconnectEvery is the pause between two reconnects of a holder whose
// lock session ended.
const reconnectEvery = 500 * time.Millisecond

// releaseSQL deletes the holder's leases and ends every advisory lock of
// the session, in one round trip.
const releaseSQL = `
	WITH gone AS (DELETE FROM run_leases WHERE key = ANY($1) AND holder = $2)
	SELECT pg_advisory_unlock_all()`

// abandon releases whatever the session holds and closes or keeps the
// connection, for a failed acquisition (the monitor is not running).
func (l *RunLocks) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if !l.conn.IsClosed() {
		if _, err := l.conn.Exec(ctx, releaseSQL, l.keys, l.holder); err == nil {
			l.locker.put(l.conn)
			return
		}
	}
	_ = l.conn.Close(ctx)
}

// renew extends the leases on conn; errLeaseTaken when any is no longer
// this holder's.
func (l *RunLocks) renew(ctx context.Context, conn *pgx.Conn) error {
	tag, err := conn.Exec(ctx, `
		UPDATE run_leases SET expires_at = now() + make_interval(secs => $3), epoch = pg_postmaster_start_time()
		WHERE key = ANY($1) AND holder = $2`, l.keys, l.holder, l.lease.Seconds())
	if err != nil {
		return err
	}
	if tag.RowsAffected() != int64(len(l.keys)) {
		return errLeaseTaken
	}
	return nil
}

// monitor renews the leases every interval; when the lock session ended,
// it reconnects and takes the locks again while the lease lasts, and
// declares them lost otherwise.
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
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		err := l.renew(ctx, l.conn)
		cancel()
		if err == nil {
			l.renewedStart = start
			l.mu.Unlock()
			continue
		}
		if !errors.Is(err, errLeaseTaken) && !l.conn.IsClosed() {
			// The renewal failed (timed out on a loaded database, was
			// cancelled) but the session lives, and with it the
			// advisory locks, which exclude every other run while
			// Postgres runs: renew at the next tick. Ending the session
			// here would free the targets while this run's play goes on.
			l.mu.Unlock()
			continue
		}
		// The session cannot vouch for the locks any more: end it, so
		// that they are surely gone with it, and take them again.
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.conn.Close(closeCtx)
		cancel()
		l.mu.Unlock()
		if !errors.Is(err, errLeaseTaken) {
			err = l.recover(err)
		}
		if err != nil {
			l.mu.Lock()
			if !l.released {
				l.lostErr = fmt.Errorf("run locks of job %s lost: %w", l.job, err)
				close(l.lost)
			}
			l.mu.Unlock()
			return
		}
	}
}

// recover reconnects until the lease runs out, takes the locks again on
// the new session and renews the leases; cause is why the old session was
// given up. Nil means the locks are held again, on l.conn.
func (l *RunLocks) recover(cause error) error {
	// The leases stand until renewedStart+lease on the server's clock
	// (renewedStart was taken before the renewal was sent); a second is
	// left for clock-rate differences and the play's stop.
	deadline := l.renewedStart.Add(l.lease - time.Second)
	for time.Now().Before(deadline) {
		until := time.Now().Add(l.timeout)
		if deadline.Before(until) {
			until = deadline
		}
		ctx, cancel := context.WithDeadline(context.Background(), until)
		conn, err := pgx.ConnectConfig(ctx, l.locker.cfg)
		if err == nil {
			start := time.Now()
			err = l.retake(ctx, conn)
			if err == nil {
				l.mu.Lock()
				l.conn, l.pid, l.renewedStart = conn, conn.PgConn().PID(), start
				l.mu.Unlock()
				cancel()
				return nil
			}
			_ = conn.Close(context.Background())
			if errors.Is(err, errLeaseTaken) {
				cancel()
				return err
			}
		}
		cancel()
		if err != nil {
			cause = err
		}
		select {
		case <-l.stop:
			return fmt.Errorf("released while reconnecting: %w", cause)
		case <-time.After(reconnectEvery):
		}
	}
	return fmt.Errorf("lease of %s ran out before Postgres answered again: %w", l.lease, cause)
}

// retake checks that the leases are still this holder's, ends the old lock
// session when it still lives (Postgres kept running but the connection
// dropped: nobody else can hold the keys meanwhile), takes the advisory
// locks on conn and renews the leases.
func (l *RunLocks) retake(ctx context.Context, conn *pgx.Conn) error {
	var mine int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM run_leases WHERE key = ANY($1) AND holder = $2`,
		l.keys, l.holder).Scan(&mine); err != nil {
		return err
	}
	if mine != len(l.keys) {
		return errLeaseTaken
	}
	key := uint64(l.keys[0])
	if _, err := conn.Exec(ctx, `
		SELECT pg_terminate_backend(pid, 2000) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND classid = $1 AND objid = $2 AND granted
		  AND pid <> pg_backend_pid()
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		uint32(key>>32), uint32(key)); err != nil {
		return err
	}
	var all bool
	if err := conn.QueryRow(ctx, `SELECT bool_and(pg_try_advisory_lock(k)) FROM unnest($1::bigint[]) AS k`,
		l.keys).Scan(&all); err != nil {
		return err
	}
	if !all {
		// Someone holds a key now: the next look tells whether it took
		// the lease too.
		_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		return errors.New("a lock is held by another session")
	}
	return l.renew(ctx, conn)
}

// Lost is closed when the locks could not be kept (see RunLocks): another
// instance may take the run over, so the holder must stop its work.
// Release does not close it.
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
// in pg_locks and pg_stat_activity); it changes when the holder took its
// locks again on a new session.
func (l *RunLocks) BackendPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// Release deletes the leases, unlocks the locks and gives the lock
// connection back to its Locker (which keeps it for another run, or closes
// it). It is idempotent; after the locks were lost it only cleans up. When
// unlocking fails the connection is closed, which ends the session and its
// locks; the leases are then deleted on a new connection if Postgres
// answers, or expire.
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
	if !l.conn.IsClosed() {
		if _, err := l.conn.Exec(ctx, releaseSQL, l.keys, l.holder); err == nil {
			l.locker.put(l.conn)
			return nil
		}
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = l.conn.Close(closeCtx)
	cancel()
	conn, err := pgx.ConnectConfig(ctx, l.locker.cfg)
	if err != nil {
		return fmt.Errorf("release run locks of job %s (their leases expire): %w", l.job, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, releaseSQL, l.keys, l.holder); err != nil {
		return fmt.Errorf("release run locks of job %s (their leases expire): %w", l.job, err)
	}
	return nil
}
