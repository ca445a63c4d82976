package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The kinds, states and final statuses of a run (runs.kind, runs.state,
// runs.status). The statuses are the result statuses of the wire contract.
const (
	RunProvision = "provision"
	RunDeploy    = "deploy"

	RunRunning = "running"
	RunDone    = "done"

	RunSucceeded   = "succeeded"
	RunFailed      = "failed"
	RunUnreachable = "unreachable"
	RunRejected    = "rejected"
	RunCancelled   = "cancelled"
)

// Run is a row of the runs table: one processed request, keyed by its job
// id. Nullable text columns read as "" when NULL; nullable times as the
// zero time.
type Run struct {
	JobID     string
	Kind      string // RunProvision or RunDeploy
	Stream    string
	RequestID string
	// Target is the lock key of the run: the server handle, or
	// address:port for a deploy to an unregistered server.
	Target string
	// ServerHandle is the registered server the run works on; "" for none.
	ServerHandle string
	Playbook     string // "" for none
	State        string // RunRunning or RunDone
	Status       string // final status once done; "" while running
	ErrorKind    string // "" for none
	// Result is the encoded (redacted) result as published; nil while running.
	Result []byte
	// Checkpoint is progress that must not be repeated by a later attempt.
	Checkpoint map[string]any
	Owner      string // the instance running (or that finished) the run
	// Attempt counts the owners the run had: 1 at first, one more at each
	// takeover. Writes are guarded by it (see FinishRun).
	Attempt    int
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time // zero while running
	UpdatedAt  time.Time
}

const runColumns = `job_id, kind, stream, request_id, target, COALESCE(server_handle, ''), COALESCE(playbook, ''),
	state, COALESCE(status, ''), COALESCE(error_kind, ''), result, checkpoint, COALESCE(owner, ''), attempt,
	created_at, started_at, finished_at, updated_at`

func scanRun(row pgx.Row) (*Run, error) {
	var r Run
	var started, finished *time.Time
	err := row.Scan(&r.JobID, &r.Kind, &r.Stream, &r.RequestID, &r.Target, &r.ServerHandle, &r.Playbook,
		&r.State, &r.Status, &r.ErrorKind, &r.Result, &r.Checkpoint, &r.Owner, &r.Attempt,
		&r.CreatedAt, &started, &finished, &r.UpdatedAt)
	if err != nil {
		return nil, err
	}
	if started != nil {
		r.StartedAt = *started
	}
	if finished != nil {
		r.FinishedAt = *finished
	}
	if r.Checkpoint == nil {
		r.Checkpoint = map[string]any{}
	}
	return &r, nil
}

// GetRun reads the run of jobID; ErrRunNotFound when there is none.
func GetRun(ctx context.Context, q Querier, jobID string) (*Run, error) {
	r, err := scanRun(q.QueryRow(ctx, `SELECT `+runColumns+` FROM runs WHERE job_id = $1`, jobID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read run %s: %w", jobID, ErrRunNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", jobID, err)
	}
	return r, nil
}

// RunStart describes a run about to start. ServerHandle and Playbook may be
// "" (stored as NULL).
type RunStart struct {
	JobID        string
	Kind         string
	Stream       string
	RequestID    string
	Target       string
	ServerHandle string
	Playbook     string
	Owner        string
}

// StartRun records that owner starts the run of s.JobID. The caller must
// hold the run's locks (AcquireRunLocks), which makes it the only live
// owner:
//   - no row yet: a running row is inserted (attempt 1); started is true;
//   - a running row: its previous owner died (its job lock is gone), so the
//     caller takes it over: owner is replaced, attempt incremented; started
//     is true and the returned Checkpoint says what the dead owner did;
//   - a done row: it is returned unchanged with started false; the caller
//     re-publishes the stored Result instead of running again;
//   - a row of another kind (the job id was used by a provision request and
//     is now reused by a deploy, or the other way round): ErrJobKindConflict
//     with the row; nothing changes. A job id names one job of one kind.
//
// The other fields of an existing row are kept as first recorded.
func StartRun(ctx context.Context, q Querier, s RunStart) (run *Run, started bool, err error) {
	run, err = scanRun(q.QueryRow(ctx, `
		INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, playbook, owner, started_at)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), NULLIF($7, ''), NULLIF($8, ''), now())
		ON CONFLICT (job_id) DO UPDATE
			SET owner = EXCLUDED.owner, attempt = runs.attempt + 1, updated_at = now()
			WHERE runs.state = 'running' AND runs.kind = EXCLUDED.kind
		RETURNING `+runColumns,
		s.JobID, s.Kind, s.Stream, s.RequestID, s.Target, s.ServerHandle, s.Playbook, s.Owner))
	if err == nil {
		return run, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("start run %s: %w", s.JobID, err)
	}
	// The row exists and is done (done rows never go back to running), or
	// it belongs to a job of another kind.
	run, err = GetRun(ctx, q, s.JobID)
	if err != nil {
		return nil, false, fmt.Errorf("start run %s: %w", s.JobID, err)
	}
	if run.Kind != s.Kind {
		return run, false, fmt.Errorf("start %s run %s: %w (a %s job)", s.Kind, s.JobID, ErrJobKindConflict, run.Kind)
	}
	return run, false, nil
}

// FinishRun marks the run done with its final status, error kind ("" for
// none) and encoded result. It is guarded by attempt: ErrStaleAttempt when
// the run was taken over since (the caller's work is void and another owner
// will finish it), ErrRunDone when it is already finished, ErrRunNotFound.
func FinishRun(ctx context.Context, q Querier, jobID string, attempt int, status, errorKind string, result []byte) error {
	tag, err := q.Exec(ctx, `
		UPDATE runs SET state = 'done', status = $3, error_kind = NULLIF($4, ''), result = $5,
			finished_at = now(), updated_at = now()
		WHERE job_id = $1 AND attempt = $2 AND state = 'running'`, jobID, attempt, status, errorKind, result)
	if err != nil {
		return fmt.Errorf("finish run %s: %w", jobID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finish run %s attempt %d: %w", jobID, attempt, runGuardError(ctx, q, jobID, attempt))
	}
	return nil
}

// SaveCheckpoint merges values into the run's checkpoint (top-level keys:
// a key given replaces the stored one, others stay). Guarded by attempt
// like FinishRun.
func SaveCheckpoint(ctx context.Context, q Querier, jobID string, attempt int, values map[string]any) error {
	if values == nil {
		values = map[string]any{}
	}
	tag, err := q.Exec(ctx, `
		UPDATE runs SET checkpoint = checkpoint || $3::jsonb, updated_at = now()
		WHERE job_id = $1 AND attempt = $2 AND state = 'running'`, jobID, attempt, values)
	if err != nil {
		return fmt.Errorf("save checkpoint of run %s: %w", jobID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("save checkpoint of run %s attempt %d: %w", jobID, attempt, runGuardError(ctx, q, jobID, attempt))
	}
	return nil
}

// TouchRun sets the run's updated_at to now, a heartbeat showing its owner
// is alive. Guarded by attempt like FinishRun.
func TouchRun(ctx context.Context, q Querier, jobID string, attempt int) error {
	tag, err := q.Exec(ctx, `UPDATE runs SET updated_at = now() WHERE job_id = $1 AND attempt = $2 AND state = 'running'`,
		jobID, attempt)
	if err != nil {
		return fmt.Errorf("touch run %s: %w", jobID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("touch run %s attempt %d: %w", jobID, attempt, runGuardError(ctx, q, jobID, attempt))
	}
	return nil
}

// runGuardError says why a write guarded by (attempt, state running)
// matched no row.
func runGuardError(ctx context.Context, q Querier, jobID string, attempt int) error {
	var state string
	var current int
	err := q.QueryRow(ctx, `SELECT state, attempt FROM runs WHERE job_id = $1`, jobID).Scan(&state, &current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrRunNotFound
	case err != nil:
		return err
	case current != attempt:
		return fmt.Errorf("%w (now attempt %d)", ErrStaleAttempt, current)
	case state == RunDone:
		return ErrRunDone
	}
	// Matched now but not a moment ago: cannot happen with the guard's
	// monotonic attempt and one-way state; report it rather than hide it.
	return fmt.Errorf("run %s changed concurrently", jobID)
}
