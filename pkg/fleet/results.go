package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Result is a job's result as ApplyResult needs it.
type Result struct {
	Handle string
	JobID  string
	// Status is the result's status on the wire (succeeded, failed,
	// unreachable, rejected, cancelled).
	Status messages.Status
	// Error is the result's error message ("" on success); ErrorKind its kind.
	Error     string
	ErrorKind messages.ErrorKind
	// Summary describes the run for the history (playbooks and their
	// outcomes); optional.
	Summary string
}

// RetryPolicy says what becomes of a failure.
type RetryPolicy struct {
	// Limit is how many failed attempts a server may have before it stays
	// FAILED (retries exhausted); at least 1.
	Limit int
	// Backoff returns the wait before the retry after the attempts-th
	// failure.
	Backoff func(attempts int) time.Duration
	// UnreachableCooldown is the wait before an UNREACHABLE server is
	// checked again.
	UnreachableCooldown time.Duration
}

// Outcome says what ApplyResult did.
type Outcome string

// The outcomes of ApplyResult.
const (
	// Applied: the result of the job the server waited for; the server moved.
	Applied Outcome = "applied"
	// Duplicate: this job's result was applied before; nothing changed.
	Duplicate Outcome = "duplicate"
	// Stale: the server does not wait for this job; recorded in history
	// and ignored.
	Stale Outcome = "stale"
)

// StatusFor maps a result status to the server status it leads to.
func StatusFor(st messages.Status) string {
	switch st {
	case messages.StatusSucceeded:
		return StatusReady
	case messages.StatusUnreachable:
		return StatusUnreachable
	}
	return StatusFailed
}

// ApplyResult completes the scheduler's part of a job's result, once per
// job id. For the job the server waits for it clears the wait and plans
// what comes next: READY and UNREACHABLE are notified (UNREACHABLE checked
// again after the cool-down); a FAILED server is retried after
// policy.Backoff while its attempts < policy.Limit, else its retries are
// exhausted and it is notified; a rejected or cancelled job fails with no
// automatic retry. An ORPHANED server stays ORPHANED and remembers the
// outcome for its return.
//
// The transition itself (status, attempts, last error, its history row) is
// made once, by whoever learns the outcome first: infra, when it stored
// the run's result (RecordRun), and then ApplyResult adds no history row;
// else (a result infra published without a run, such as a refused target)
// ApplyResult makes it, by actor. A result applied before changes nothing;
// a result of a job the server does not wait for is recorded in history
// and ignored, unless infra recorded it (agents publishing to infra
// directly): the server is then right already.
func (s *Store) ApplyResult(ctx context.Context, r Result, actor string, policy RetryPolicy) (Outcome, *Server, error) {
	if err := checkActor(actor); err != nil {
		return "", nil, err
	}
	if r.JobID == "" || !r.Status.Valid() {
		return "", nil, fmt.Errorf("%w: result needs a job id and a valid status (got %q)", ErrInvalid, r.Status)
	}
	policy.Limit = max(policy.Limit, 1)
	var outcome Outcome
	srv, err := s.change(ctx, r.Handle, func(tx pgx.Tx, srv *Server) ([]History, error) {
		to := StatusFor(r.Status)
		var recorded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM server_history
			WHERE job_id = $1 AND event = 'result' AND handle = $2)`, r.JobID, srv.Handle).Scan(&recorded); err != nil {
			return nil, fmt.Errorf("look up result of job %s: %w", r.JobID, err)
		}
		// A run whose outcome left the status as it was has no row; its
		// last job and status say infra recorded it.
		current := srv.Status
		if current == StatusOrphaned {
			current = srv.OrphanedFrom
		}
		recorded = recorded || (srv.LastJobID == r.JobID && current == to)
		if srv.PendingJobID != r.JobID {
			if recorded {
				outcome = Duplicate
				return nil, nil
			}
			outcome = Stale
			why := "result of a job the server does not wait for"
			if srv.PendingJobID != "" {
				why += " (it waits for " + srv.PendingJobID + ")"
			}
			return []History{{Event: EventStaleResult, From: srv.Status, To: srv.Status,
				Reason: why + ": " + resultReason(r), JobID: r.JobID, Actor: actor}}, nil
		}
		outcome = Applied
		var hist []History
		if !recorded {
			hist = settle(srv, r, true, actor)
		}
		srv.PendingJobID, srv.PendingAction, srv.QueuedAt = "", "", time.Time{}
		srv.NextAttemptAt = time.Time{}
		srv.RetriesExhausted = false
		now := s.now()
		var note string
		switch to {
		case StatusUnreachable:
			srv.NextAttemptAt = now.Add(policy.UnreachableCooldown)
		case StatusFailed:
			retryable := r.Status == messages.StatusFailed
			if !retryable || srv.Attempts >= policy.Limit {
				srv.RetriesExhausted = true
				if retryable {
					note = fmt.Sprintf(" [retries exhausted: %d of %d]", srv.Attempts, policy.Limit)
				} else {
					note = " [not retried automatically]"
				}
			} else if policy.Backoff != nil {
				wait := policy.Backoff(srv.Attempts)
				srv.NextAttemptAt = now.Add(wait)
				note = fmt.Sprintf(" [retry %d of %d in %s]", srv.Attempts, policy.Limit-1, wait.Round(time.Second))
			}
		}
		for i := range hist {
			hist[i].Reason += note
		}
		if srv.Status != StatusOrphaned {
			if err := s.maybeNotify(ctx, tx, srv); err != nil {
				return nil, err
			}
		}
		return hist, nil
	})
	if err != nil {
		return "", nil, err
	}
	return outcome, srv, nil
}
