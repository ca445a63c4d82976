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

// ApplyResult records a job's result on its server, deduplicated by job
// id: the job the server waits for moves it to READY (attempts reset),
// FAILED (attempts + 1; retried after policy.Backoff while attempts <
// policy.Limit, else retries exhausted and notified) or UNREACHABLE
// (checked again after the cool-down); a rejected or cancelled job fails
// with no automatic retry. A result applied before changes nothing; a
// result of another job is recorded in history and ignored. An ORPHANED
// server stays ORPHANED and remembers the outcome for its return.
//
// Infra may have written the outcome already (it sets the status and
// last_job_id with the run row); ApplyResult then does not count the
// attempt twice.
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
		reason := string(r.Status)
		if r.Error != "" {
			reason += ": " + r.Error
		}
		if r.Summary != "" {
			reason += " (" + r.Summary + ")"
		}
		if srv.PendingJobID != r.JobID {
			var seen bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM server_history
				WHERE job_id = $1 AND event = 'result' AND handle = $2)`, r.JobID, srv.Handle).Scan(&seen); err != nil {
				return nil, fmt.Errorf("look up result of job %s: %w", r.JobID, err)
			}
			if seen {
				outcome = Duplicate
				return nil, nil
			}
			outcome = Stale
			why := "result of a job the server does not wait for"
			if srv.PendingJobID != "" {
				why += " (it waits for " + srv.PendingJobID + ")"
			}
			return []History{{Event: EventStaleResult, From: srv.Status, To: srv.Status,
				Reason: why + ": " + reason, JobID: r.JobID, Actor: actor}}, nil
		}
		outcome = Applied
		from := srv.Status
		infraWrote := srv.LastJobID == r.JobID && srv.Status == to
		srv.PendingJobID, srv.PendingAction, srv.QueuedAt = "", "", time.Time{}
		srv.LastJobID = r.JobID
		srv.LastError = r.Error
		srv.NextAttemptAt = time.Time{}
		srv.RetriesExhausted = false
		now := s.now()
		switch to {
		case StatusReady:
			srv.Attempts = 0
		case StatusUnreachable:
			if !infraWrote {
				srv.Attempts++
			}
			srv.NextAttemptAt = now.Add(policy.UnreachableCooldown)
		case StatusFailed:
			if !infraWrote {
				srv.Attempts++
			}
			retryable := r.Status == messages.StatusFailed
			if !retryable || srv.Attempts >= policy.Limit {
				srv.RetriesExhausted = true
				if retryable {
					reason += fmt.Sprintf(" [retries exhausted: %d of %d]", srv.Attempts, policy.Limit)
				} else {
					reason += " [not retried automatically]"
				}
			} else if policy.Backoff != nil {
				wait := policy.Backoff(srv.Attempts)
				srv.NextAttemptAt = now.Add(wait)
				reason += fmt.Sprintf(" [retry %d of %d in %s]", srv.Attempts, policy.Limit-1, wait.Round(time.Second))
			}
		}
		if srv.Status == StatusOrphaned {
			srv.OrphanedFrom = to
			return []History{{Event: EventResult, From: from, To: from, Reason: reason + " (server is ORPHANED)", JobID: r.JobID, Actor: actor}}, nil
		}
		srv.Status = to
		if err := s.maybeNotify(ctx, tx, srv); err != nil {
			return nil, err
		}
		return []History{{Event: EventResult, From: from, To: to, Reason: reason, JobID: r.JobID, Actor: actor}}, nil
	})
	if err != nil {
		return "", nil, err
	}
	return outcome, srv, nil
}
