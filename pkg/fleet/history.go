package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// The events of server_history.
const (
	// EventDetected: a source listed the server for the first time.
	EventDetected = "detected"
	// EventOrphaned: the server's source no longer lists it.
	EventOrphaned = "orphaned"
	// EventReturned: an ORPHANED server is listed by its source again.
	EventReturned = "returned"
	// EventQueued: the reconcile loop queued a job (message in the outbox).
	EventQueued = "queued"
	// EventPublished: the outbox relay handed the job to infra.
	EventPublished = "published"
	// EventResult: the result of the job the server waited for.
	EventResult = "result"
	// EventStaleResult: a result of a job the server no longer waits for,
	// recorded and ignored.
	EventStaleResult = "stale_result"
	// EventRequested: an operator (or the health checks) asked for an action.
	EventRequested = "requested"
	// EventPaused and EventResumed: the server left or rejoined the loop.
	EventPaused  = "paused"
	EventResumed = "resumed"
	// EventRequeued: a job that never reported back was handed to infra
	// again (same job id).
	EventRequeued = "requeued"
	// EventTransition: any other status change (Transition).
	EventTransition = "transition"
)

// History is one row of a server's history.
type History struct {
	ID     int64
	Handle string
	Event  string
	// From is the status before the event ("" for a new server); To the
	// status after it (equal to From when the status did not change).
	From   string
	To     string
	At     time.Time
	Reason string
	JobID  string
	// Actor is who did it: "scheduler", "infra", "health", "detector:<source>",
	// or the operator's name.
	Actor string
}

// History returns the last limit history rows of the server, newest first.
func (s *Store) History(ctx context.Context, handle string, limit int) ([]History, error) {
	if limit <= 0 {
		limit = 50
	}
	rows, err := s.db.Query(ctx, `SELECT id, handle, event, COALESCE(from_status, ''), to_status, at, reason,
		COALESCE(job_id, ''), actor FROM server_history WHERE handle = $1 ORDER BY id DESC LIMIT $2`, handle, limit)
	if err != nil {
		return nil, fmt.Errorf("history of server %s: %w", handle, err)
	}
	hist, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (History, error) {
		var h History
		err := r.Scan(&h.ID, &h.Handle, &h.Event, &h.From, &h.To, &h.At, &h.Reason, &h.JobID, &h.Actor)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("history of server %s: %w", handle, err)
	}
	return hist, nil
}

// historyQuery is the statement adding h (at at).
func historyQuery(h History, at time.Time) (string, []any) {
	return `INSERT INTO server_history (handle, event, from_status, to_status, at, reason, job_id, actor)
		VALUES ($1, $2, NULLIF($3, ''), $4, $5, $6, NULLIF($7, ''), $8)`,
		[]any{h.Handle, h.Event, h.From, h.To, at, h.Reason, h.JobID, h.Actor}
}

// historyBatch writes many history rows in one statement.
type historyBatch struct {
	handles, events, froms, tos, reasons, jobs, actors []string
}

func (b *historyBatch) add(h History) {
	b.handles = append(b.handles, h.Handle)
	b.events = append(b.events, h.Event)
	b.froms = append(b.froms, h.From)
	b.tos = append(b.tos, h.To)
	b.reasons = append(b.reasons, h.Reason)
	b.jobs = append(b.jobs, h.JobID)
	b.actors = append(b.actors, h.Actor)
}

func (b *historyBatch) write(ctx context.Context, q store.Querier, at time.Time) error {
	if len(b.handles) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, `INSERT INTO server_history (handle, event, from_status, to_status, at, reason, job_id, actor)
		SELECT h, e, NULLIF(f, ''), t, $8, r, NULLIF(j, ''), a
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) AS x(h, e, f, t, r, j, a)`,
		b.handles, b.events, b.froms, b.tos, b.reasons, b.jobs, b.actors, at)
	if err != nil {
		return fmt.Errorf("record history of %d servers: %w", len(b.handles), err)
	}
	return nil
}
