package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Priorities of the reconcile loop, lowest first (seed 000: new servers
// first).
const (
	PriorityNew         = 0 // NEW servers and operators' provision requests
	PriorityRetry       = 1 // FAILED servers with retry budget, after backoff
	PriorityUnreachable = 2 // UNREACHABLE servers, after the cool-down
	PriorityRecovery    = 3 // servers flagged for recovery
	PriorityRebuild     = 4 // servers an operator asked to rebuild
)

// Candidate is a server the reconcile loop may queue a job for.
type Candidate struct {
	Handle   string
	Version  int64
	Status   string
	Labels   map[string]string
	Source   string
	Attempts int
	// Action is the job to queue; Priority orders candidates.
	Action   Action
	Priority int
	// RequestedBy is who asked, for a requested action ("" otherwise).
	RequestedBy string
}

// Due returns up to limit servers that need a job now, in priority order:
// not paused, no job in flight, not ORPHANED, and NEW, FAILED with budget
// left and backoff over, UNREACHABLE after the cool-down, or with an open
// request. It reads only due rows (a partial index), so a tick costs what
// changes, not the fleet's size.
func (s *Store) Due(ctx context.Context, limit int) ([]Candidate, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit %d", ErrInvalid, limit)
	}
	rows, err := s.db.Query(ctx, `
		SELECT handle, version, status, labels, source, attempts, COALESCE(requested_by, ''),
			CASE
				WHEN requested_action = 'provision' OR (requested_action IS NULL AND status = 'NEW') THEN 0
				WHEN requested_action = 'recovery' THEN 3
				WHEN requested_action = 'rebuild' THEN 4
				WHEN status = 'FAILED' THEN 1
				ELSE 2
			END AS prio,
			COALESCE(requested_action, 'provision')
		FROM servers
		WHERE NOT paused AND pending_job_id IS NULL
		  AND (status IN ('NEW', 'UNREACHABLE') OR (status = 'FAILED' AND NOT retries_exhausted)
		       OR requested_action IS NOT NULL)
		  AND status NOT IN ('ORPHANED', 'QUEUED', 'PROVISIONING')
		  AND (requested_action IS NOT NULL OR next_attempt_at IS NULL OR next_attempt_at <= $1)
		ORDER BY prio, COALESCE(requested_at, status_changed_at), handle
		LIMIT $2`, s.now(), limit)
	if err != nil {
		return nil, fmt.Errorf("due servers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Candidate, error) {
		var c Candidate
		var action string
		err := r.Scan(&c.Handle, &c.Version, &c.Status, &c.Labels, &c.Source, &c.Attempts, &c.RequestedBy, &c.Priority, &action)
		c.Action = Action(action)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("due servers: %w", err)
	}
	return out, nil
}

// Job is a job Queue writes: a server at the version the caller read, the
// job's id and encoded message.
type Job struct {
	Handle  string
	Version int64
	Action  Action
	JobID   string
	// Payload is the encoded ProvisionerMessage (messages.Encode).
	Payload []byte
	// Stream the message goes to; default provisioner:queue.
	Stream string
	Reason string
}

// Queue moves each job's server to QUEUED and writes its message to the
// outbox, all in one transaction, by compare-and-set on the version the
// caller read: a server changed since (by another replica, an operator, a
// result) is skipped, so two replicas never queue two jobs for one server.
// The open request the job answers is cleared. It returns the handles
// queued.
func (s *Store) Queue(ctx context.Context, jobs []Job, actor string) ([]string, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	n := len(jobs)
	handles, jobIDs, actions, reasons := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions := make([]int64, n)
	byHandle := make(map[string]*Job, n)
	for i := range jobs {
		j := &jobs[i]
		if !j.Action.Valid() || j.JobID == "" || len(j.Payload) == 0 {
			return nil, fmt.Errorf("%w: job %d for %s needs an action, a job id and a payload", ErrInvalid, i, j.Handle)
		}
		if j.Stream == "" {
			j.Stream = messages.StreamProvisionerQueue
		}
		handles[i], versions[i], jobIDs[i], actions[i], reasons[i] = j.Handle, j.Version, j.JobID, string(j.Action), j.Reason
		byHandle[j.Handle] = j
	}
	now := s.now()
	var queued []string
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// The jobs are joined once, to the rows they lock: the plan Postgres
		// keeps for a statement run many times (a generic plan, from the
		// sixth run on) scanned a second join of them once a row, which
		// took 22 s a tick for 10,000 jobs.
		rows, err := tx.Query(ctx, `
			WITH j AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS j(handle, version, job_id, action)),
			old AS (SELECT s.handle, s.status, j.version, j.job_id, j.action FROM servers s JOIN j USING (handle)
				WHERE s.version = j.version ORDER BY s.handle FOR UPDATE OF s)
			UPDATE servers s SET status = 'QUEUED', pending_job_id = old.job_id, pending_action = old.action,
				queued_at = $5, requested_action = NULL, requested_by = NULL, requested_at = NULL,
				retries_exhausted = false,
				last_recovery_at = CASE WHEN old.action = 'recovery' THEN $5 ELSE s.last_recovery_at END
			FROM old
			WHERE s.handle = old.handle AND s.version = old.version
			  AND s.pending_job_id IS NULL AND s.status <> 'ORPHANED'
			RETURNING s.handle, old.status`, handles, versions, jobIDs, actions, now)
		if err != nil {
			return fmt.Errorf("queue jobs: %w", err)
		}
		var h, from string
		var hist historyBatch
		var obHandles, obStreams, obJobs []string
		var obPayloads [][]byte
		_, err = pgx.ForEachRow(rows, []any{&h, &from}, func() error {
			j := byHandle[h]
			queued = append(queued, h)
			reason := fmt.Sprintf("%s (%s)", j.Action, j.Reason)
			if j.Reason == "" {
				reason = string(j.Action)
			}
			hist.add(History{Handle: h, Event: EventQueued, From: from, To: StatusQueued, Reason: reason, JobID: j.JobID, Actor: actor})
			obHandles, obStreams, obJobs = append(obHandles, h), append(obStreams, j.Stream), append(obJobs, j.JobID)
			obPayloads = append(obPayloads, j.Payload)
			return nil
		})
		if err != nil {
			return fmt.Errorf("queue jobs: %w", err)
		}
		if len(queued) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (stream, handle, job_id, payload, created_at)
			SELECT * , $5::timestamptz FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])`,
			obStreams, obHandles, obJobs, obPayloads, now); err != nil {
			return fmt.Errorf("write outbox: %w", err)
		}
		return hist.write(ctx, tx, now)
	})
	if err != nil {
		return nil, err
	}
	return queued, nil
}

// FlagRecovery asks for a recovery of a READY server on behalf of the
// health checks (actor), unless it has an open request, a job in flight,
// is paused, or had a recovery less than cooldown ago. It reports whether
// it flagged the server.
func (s *Store) FlagRecovery(ctx context.Context, handle, actor, reason string, cooldown time.Duration) (bool, error) {
	if err := checkActor(actor); err != nil {
		return false, err
	}
	flagged := false
	_, err := s.change(ctx, handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		now := s.now()
		if srv.Status != StatusReady || srv.Paused || srv.RequestedAction != "" || srv.PendingJobID != "" ||
			(!srv.LastRecoveryAt.IsZero() && now.Sub(srv.LastRecoveryAt) < cooldown) {
			return nil, nil
		}
		flagged = true
		srv.RequestedAction, srv.RequestedBy, srv.RequestedAt = ActionRecovery, actor, now
		return []History{{Event: EventRequested, From: srv.Status, To: srv.Status, Reason: "requested recovery: " + reason, Actor: actor}}, nil
	})
	return flagged, err
}
