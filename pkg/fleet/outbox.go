package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxEntry is a message waiting in the outbox.
type OutboxEntry struct {
	ID      int64
	Stream  string
	Handle  string
	JobID   string
	Payload []byte
}

// PublishFunc publishes entries (all of one Relay call, possibly of several
// streams) and returns their stream entry ids in order. It must publish all
// or return an error.
type PublishFunc func(ctx context.Context, entries []OutboxEntry) ([]string, error)

// Relay publishes up to limit unpublished outbox entries, oldest first, and
// marks them published; the servers that waited for them move from QUEUED
// to PROVISIONING (the job is in infra's hands), with history. Entries are
// claimed with FOR UPDATE SKIP LOCKED, so replicas relaying at once never
// publish one entry twice; a crash after publish and before the commit
// publishes it again on the next relay, with the same job id, which infra
// runs once. It returns how many entries it published.
func (s *Store) Relay(ctx context.Context, limit int, actor string, publish PublishFunc) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit %d", ErrInvalid, limit)
	}
	n := 0
	err := txWithEffect(ctx, s.db, func(tx pgx.Tx, effectDone func() context.Context) error {
		rows, err := tx.Query(ctx, `SELECT id, stream, COALESCE(handle, ''), job_id, payload FROM outbox
			WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return fmt.Errorf("claim outbox: %w", err)
		}
		entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEntry, error) {
			var e OutboxEntry
			err := r.Scan(&e.ID, &e.Stream, &e.Handle, &e.JobID, &e.Payload)
			return e, err
		})
		if err != nil {
			return fmt.Errorf("claim outbox: %w", err)
		}
		if len(entries) == 0 {
			return nil
		}
		// Lock the servers before publishing (in handle order, as Queue
		// does), so that nothing after the publish can deadlock and roll
		// back the record of it.
		lockHandles := make([]string, 0, len(entries))
		for _, e := range entries {
			if e.Handle != "" {
				lockHandles = append(lockHandles, e.Handle)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM servers WHERE handle = ANY($1) ORDER BY handle FOR UPDATE`, lockHandles); err != nil {
			return fmt.Errorf("lock servers of the outbox entries: %w", err)
		}
		ids, err := publish(ctx, entries)
		if err != nil {
			return fmt.Errorf("publish %d outbox entries: %w", len(entries), err)
		}
		ctx := effectDone()
		if len(ids) != len(entries) {
			return fmt.Errorf("publish returned %d ids for %d entries", len(ids), len(entries))
		}
		now := s.now()
		rowIDs := make([]int64, len(entries))
		handles, jobs := make([]string, len(entries)), make([]string, len(entries))
		for i, e := range entries {
			rowIDs[i], handles[i], jobs[i] = e.ID, e.Handle, e.JobID
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox o SET published_at = $2, entry_id = x.entry
			FROM unnest($1::bigint[], $3::text[]) AS x(id, entry) WHERE o.id = x.id`, rowIDs, now, ids); err != nil {
			return fmt.Errorf("mark outbox published: %w", err)
		}
		rows, err = tx.Query(ctx, `UPDATE servers s SET status = 'PROVISIONING'
			FROM unnest($1::text[], $2::text[]) AS x(handle, job)
			WHERE s.handle = x.handle AND s.pending_job_id = x.job AND s.status = 'QUEUED'
			RETURNING s.handle, x.job`, handles, jobs)
		if err != nil {
			return fmt.Errorf("mark servers provisioning: %w", err)
		}
		var hist historyBatch
		var h, job string
		if _, err := pgx.ForEachRow(rows, []any{&h, &job}, func() error {
			hist.add(History{Handle: h, Event: EventPublished, From: StatusQueued, To: StatusProvisioning,
				Reason: "message handed to infra", JobID: job, Actor: actor})
			return nil
		}); err != nil {
			return fmt.Errorf("mark servers provisioning: %w", err)
		}
		n = len(entries)
		return hist.write(ctx, tx, now)
	})
	return n, err
}

// OutboxBacklog returns how many outbox entries wait to be published and
// the age of the oldest (0 when none).
func (s *Store) OutboxBacklog(ctx context.Context) (int, time.Duration, error) {
	var n int
	var oldest *time.Time
	err := s.db.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox WHERE published_at IS NULL`).Scan(&n, &oldest)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox backlog: %w", err)
	}
	if oldest == nil {
		return n, 0, nil
	}
	return n, max(0, s.now().Sub(*oldest)), nil
}

// PruneOutbox deletes published entries older than age and returns how many.
func (s *Store) PruneOutbox(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < $1`, s.now().Add(-age))
	if err != nil {
		return 0, fmt.Errorf("prune outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}

// StuckJob is a job a server has waited for longer than expected.
type StuckJob struct {
	Handle   string
	JobID    string
	QueuedAt time.Time
	// RunState is infra's run of the job: "" (no run: the message was
	// lost, for example by a Redis restart without persistence), "running"
	// or "done".
	RunState string
	// Result is the run's stored encoded result when RunState is "done"
	// (the published result was lost): apply it.
	Result []byte
}

// Stuck returns up to limit servers whose job was published more than age
// ago and has no result yet, and is not running now (infra's run row has
// not moved for age either), with what infra knows of the job.
func (s *Store) Stuck(ctx context.Context, age time.Duration, limit int) ([]StuckJob, error) {
	cutoff := s.now().Add(-age)
	rows, err := s.db.Query(ctx, `
		SELECT s.handle, s.pending_job_id, s.queued_at, COALESCE(r.state, ''), r.result
		FROM servers s LEFT JOIN runs r ON r.job_id = s.pending_job_id
		WHERE s.pending_job_id IS NOT NULL AND s.queued_at < $1
		  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = s.pending_job_id AND o.published_at IS NULL)
		  AND (r.job_id IS NULL OR r.state = 'done' OR r.updated_at < $1)
		ORDER BY s.queued_at LIMIT $2`, cutoff, limit)
	if err != nil {
		return nil, fmt.Errorf("stuck jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckJob, error) {
		var j StuckJob
		err := r.Scan(&j.Handle, &j.JobID, &j.QueuedAt, &j.RunState, &j.Result)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("stuck jobs: %w", err)
	}
	return out, nil
}

// Requeue hands the server's pending job to infra again, with the same job
// id and message (infra runs a job id once, and re-publishes the result of
// one it finished), after the first message was lost. It writes a new
// outbox entry and a history row; it does nothing when the server no
// longer waits for jobID.
func (s *Store) Requeue(ctx context.Context, handle, jobID, actor, reason string) (bool, error) {
	if err := checkActor(actor); err != nil {
		return false, err
	}
	done := false
	_, err := s.change(ctx, handle, func(tx pgx.Tx, srv *Server) ([]History, error) {
		if srv.PendingJobID != jobID {
			return nil, nil
		}
		var stream string
		var payload []byte
		err := tx.QueryRow(ctx, `SELECT stream, payload FROM outbox WHERE job_id = $1 ORDER BY id DESC LIMIT 1`, jobID).
			Scan(&stream, &payload)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("requeue job %s of %s: its message is no longer in the outbox", jobID, handle)
		}
		if err != nil {
			return nil, fmt.Errorf("requeue job %s of %s: %w", jobID, handle, err)
		}
		now := s.now()
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (stream, handle, job_id, payload, created_at) VALUES ($1, $2, $3, $4, $5)`,
			stream, handle, jobID, payload, now); err != nil {
			return nil, fmt.Errorf("requeue job %s of %s: %w", jobID, handle, err)
		}
		srv.QueuedAt = now
		done = true
		return []History{{Event: EventRequeued, From: srv.Status, To: srv.Status, Reason: reason, JobID: jobID, Actor: actor}}, nil
	})
	return done, err
}
