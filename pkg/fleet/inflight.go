package fleet

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// InFlightRun is a run infra has started and not finished (from infra's
// runs table), as operators see it.
type InFlightRun struct {
	JobID    string
	Kind     string
	Target   string
	Playbook string // "" for none
	Owner    string // the instance running it
	Attempt  int
	// RunningSec is how long the run has been running (since it started,
	// or was created when it has no start), by the database's clock.
	RunningSec float64
}

// InFlight returns the runs in flight, oldest first.
func (s *Store) InFlight(ctx context.Context) ([]InFlightRun, error) {
	rows, err := s.db.Query(ctx, `SELECT job_id, kind, target, coalesce(playbook, ''), coalesce(owner, ''), attempt,
		extract(epoch FROM now() - coalesce(started_at, created_at))::float8
		FROM runs WHERE state = 'running' ORDER BY coalesce(started_at, created_at)`)
	if err != nil {
		return nil, fmt.Errorf("runs in flight: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InFlightRun, error) {
		var run InFlightRun
		err := r.Scan(&run.JobID, &run.Kind, &run.Target, &run.Playbook, &run.Owner, &run.Attempt, &run.RunningSec)
		return run, err
	})
	if err != nil {
		return nil, fmt.Errorf("runs in flight: %w", err)
	}
	return runs, nil
}
