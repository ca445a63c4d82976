package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// HistoryActor is the actor of the server_history rows TransitionServer
// writes: the infra service, the one writer of server status outside the
// scheduler (package fleet writes its own rows).
const HistoryActor = "infra"

// casServerStatusLogged is casServerStatus from the row cur, plus a
// server_history row for the change, in one statement: a status written
// without its history row cannot happen. A write that leaves the status as
// it was (last_error or last_job_id only) adds no row.
func casServerStatusLogged(ctx context.Context, q Querier, cur *Server, status string, lastError *string, jobID string) (*Server, error) {
	reason := "set by infra"
	if lastError != nil && *lastError != "" {
		reason += ": " + *lastError
	}
	s, err := scanServer(q.QueryRow(ctx, `
		WITH upd AS (
			UPDATE servers SET status = $3, last_error = $4, last_job_id = COALESCE(NULLIF($5, ''), last_job_id)
			WHERE handle = $1 AND version = $2
			RETURNING *
		), logged AS (
			INSERT INTO server_history (handle, event, from_status, to_status, reason, job_id, actor)
			SELECT handle, 'transition', $6, status, $7, NULLIF($5, ''), $8 FROM upd WHERE status IS DISTINCT FROM $6
		)
		SELECT `+serverColumns+` FROM upd`,
		cur.Handle, cur.Version, status, lastError, jobID, cur.Status, reason, HistoryActor))
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("set server %s status %s: %w", cur.Handle, status, err)
	}
	if err := serverExists(ctx, q, cur.Handle); err != nil {
		return nil, fmt.Errorf("set server %s status %s: %w", cur.Handle, status, err)
	}
	return nil, fmt.Errorf("set server %s status %s from version %d: %w", cur.Handle, status, cur.Version, ErrVersionConflict)
}
