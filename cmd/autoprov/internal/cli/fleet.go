package cli

import (
	"context"
	"fmt"
	"sort"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// fleetStatus is what status shows from Postgres: servers by status and
// the runs in flight.
type fleetStatus struct {
	Servers map[string]int64 `json:"servers_by_status"`
	Runs    []runStatus      `json:"runs_in_flight"`
}

type runStatus struct {
	JobID      string  `json:"job_id"`
	Kind       string  `json:"kind"`
	Target     string  `json:"target"`
	Playbook   string  `json:"playbook,omitempty"`
	Owner      string  `json:"owner,omitempty"`
	Attempt    int     `json:"attempt"`
	RunningSec float64 `json:"running_seconds"`
}

// fleet reads the fleet's state from the database DATABASE_URL names.
func fleet(ctx context.Context, dsn string) (*fleetStatus, error) {
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fs := &fleetStatus{Servers: map[string]int64{}, Runs: []runStatus{}}
	rows, err := pool.Query(ctx, `SELECT status, count(*) FROM servers GROUP BY status ORDER BY status`)
	if err != nil {
		return nil, fmt.Errorf("servers by status: %w", err)
	}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		fs.Servers[s] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("servers by status: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT job_id, kind, target, coalesce(playbook, ''), coalesce(owner, ''), attempt,
		extract(epoch FROM now() - coalesce(started_at, created_at))::float8
		FROM runs WHERE state = 'running' ORDER BY coalesce(started_at, created_at)`)
	if err != nil {
		return nil, fmt.Errorf("runs in flight: %w", err)
	}
	for rows.Next() {
		var r runStatus
		if err := rows.Scan(&r.JobID, &r.Kind, &r.Target, &r.Playbook, &r.Owner, &r.Attempt, &r.RunningSec); err != nil {
			return nil, err
		}
		fs.Runs = append(fs.Runs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("runs in flight: %w", err)
	}
	return fs, nil
}

func printFleet(g *globals, fs *fleetStatus) error {
	w := g.env.Stdout
	fmt.Fprintln(w)
	t := newTable(w, "SERVER STATUS", "SERVERS")
	statuses := make([]string, 0, len(fs.Servers))
	for s := range fs.Servers {
		statuses = append(statuses, s)
	}
	sort.Strings(statuses)
	for _, s := range statuses {
		t.row(s, itoa(fs.Servers[s]))
	}
	if len(fs.Servers) == 0 {
		t.row("(no servers)", "")
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	t = newTable(w, "RUN IN FLIGHT", "KIND", "TARGET", "PLAYBOOK", "OWNER", "ATTEMPT", "RUNNING FOR")
	for _, r := range fs.Runs {
		t.row(r.JobID, r.Kind, r.Target, orDash(r.Playbook), orDash(r.Owner), fmt.Sprint(r.Attempt), seconds(r.RunningSec))
	}
	if len(fs.Runs) == 0 {
		t.row("(none)", "", "", "", "", "", "")
	}
	return t.flush()
}
