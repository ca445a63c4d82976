package cli

import (
	"context"
	"fmt"
	"sort"

	fleetpkg "github.com/autoprovisioner/autoprovisioner/pkg/fleet"
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

// fleet reads the fleet's state from the database DATABASE_URL names,
// through pkg/fleet (the fleet's one reader and writer): the servers by
// status (statuses with none left out) and the runs in flight.
func fleet(ctx context.Context, dsn string) (*fleetStatus, error) {
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fl := fleetpkg.New(pool, fleetpkg.Options{})
	counts, err := fl.Count(ctx, fleetpkg.Filter{})
	if err != nil {
		return nil, err
	}
	fs := &fleetStatus{Servers: make(map[string]int64, len(counts)), Runs: []runStatus{}}
	for st, n := range counts {
		if n > 0 {
			fs.Servers[st] = int64(n)
		}
	}
	runs, err := fl.InFlight(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		fs.Runs = append(fs.Runs, runStatus(r))
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
