package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs queries. *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx
// satisfy it, so every query function works on a pool or inside a
// transaction the caller controls.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ Querier = (*pgxpool.Pool)(nil)
	_ Querier = (*pgxpool.Conn)(nil)
	_ Querier = (*pgx.Conn)(nil)
	_ Querier = pgx.Tx(nil)
)

// Errors the query functions return (wrapped with context); test for them
// with errors.Is.
var (
	// ErrServerNotFound: no server has the handle (or address) asked for.
	ErrServerNotFound = errors.New("server not found")
	// ErrVersionConflict: a compare-and-set update found the row changed by
	// someone else since it was read; re-read and decide again.
	ErrVersionConflict = errors.New("server changed concurrently (version conflict)")
	// ErrRunNotFound: no run has the job id asked for.
	ErrRunNotFound = errors.New("run not found")
	// ErrStaleAttempt: the run was taken over by a newer attempt (another
	// owner); the caller's attempt must stop writing to it.
	ErrStaleAttempt = errors.New("run taken over by a newer attempt")
	// ErrRunDone: the run is already finished; it cannot be finished again
	// or given a checkpoint.
	ErrRunDone = errors.New("run already finished")
	// ErrJobKindConflict: the job id is already the id of a job of another
	// kind (provision or deploy); a job id names one job of one kind.
	ErrJobKindConflict = errors.New("job id already used by a job of another kind")
)

// Hourly runs sql, whose rows are (hour timestamptz, outcome text, count
// bigint), and returns the counts by hour (UTC) and outcome: the runs per
// hour of the deployer's console.
func Hourly(ctx context.Context, q Querier, sql string, args ...any) (map[time.Time]map[string]int, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[time.Time]map[string]int{}
	for rows.Next() {
		var at time.Time
		var outcome string
		var n int
		if err := rows.Scan(&at, &outcome, &n); err != nil {
			return nil, err
		}
		at = at.UTC()
		if out[at] == nil {
			out[at] = map[string]int{}
		}
		out[at][outcome] += n
	}
	return out, rows.Err()
}
