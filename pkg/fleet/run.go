package fleet

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Infra's door to server state. Infra runs the jobs and is the first to
// know their outcome, so it makes the transition a run causes, in the
// transaction that stores the run's result; the scheduler, when the result
// reaches it, only completes its own bookkeeping (ApplyResult). Whoever
// makes a transition writes its one history row: a server moved by infra
// has exactly one "result" row for the job, by infra. Agents that publish
// to infra directly, with no scheduler, still leave the server right.

// RunKind says what a run does to its server's state.
type RunKind int

// The kinds of RecordRun.
const (
	// ProvisionRun: a provisioning (setup, recovery, rebuild) ends READY
	// (attempts reset), FAILED or UNREACHABLE (attempts + 1).
	ProvisionRun RunKind = iota
	// DeployRun: a deploy only reports a server it found down
	// (UNREACHABLE, attempts unchanged); other outcomes leave it alone.
	DeployRun
)

// StartProvisioning marks the server PROVISIONING for infra's job jobID
// (last error cleared) and returns it as written. An ORPHANED server stays
// as it is (its source dropped it: that state stands). A history row is
// written only when the status changes: the scheduler's publish usually
// moved it to PROVISIONING already.
func (s *Store) StartProvisioning(ctx context.Context, handle, jobID, actor string) (*Server, error) {
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	return s.changeIn(ctx, s.db, handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		if srv.Status == StatusOrphaned {
			return nil, nil
		}
		from := srv.Status
		srv.Status, srv.LastError, srv.LastJobID = StatusProvisioning, "", jobID
		if from == StatusProvisioning {
			return nil, nil
		}
		return []History{{Event: EventTransition, From: from, To: StatusProvisioning,
			Reason: "run started", JobID: jobID, Actor: actor}}, nil
	})
}

// RecordRun records the outcome of infra's run r on its server, inside tx
// (the transaction that stores the run's result): the one transition the
// run causes, with its history row (event "result", by actor). It reports
// whether the server's status changed. A deploy that did not find the
// server down changes nothing. Notifications, retries and backoff are the
// scheduler's, added by ApplyResult when the result reaches it.
func (s *Store) RecordRun(ctx context.Context, tx pgx.Tx, r Result, kind RunKind, actor string) (moved bool, err error) {
	if err := checkActor(actor); err != nil {
		return false, err
	}
	if r.JobID == "" || !r.Status.Valid() {
		return false, fmt.Errorf("%w: run outcome needs a job id and a valid status (got %q)", ErrInvalid, r.Status)
	}
	if kind == DeployRun && r.Status != messages.StatusUnreachable {
		return false, nil
	}
	_, err = s.changeIn(ctx, tx, r.Handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		from := srv.Status
		h := settle(srv, r, kind == ProvisionRun, actor)
		moved = srv.Status != from
		return h, nil
	})
	if err != nil {
		return false, fmt.Errorf("record run %s on server %s: %w", r.JobID, r.Handle, err)
	}
	return moved, nil
}

// settle is the transition a job's outcome causes, made by whoever learns
// the outcome first (RecordRun, or ApplyResult when infra did not): the
// status StatusFor says (an ORPHANED server keeps its status and remembers
// the outcome for its return), the last job and error, and the attempts
// (reset on READY, + 1 on a failure when counted). It returns the history
// row to write: none when the status stays as it was.
func settle(srv *Server, r Result, countAttempt bool, actor string) []History {
	to := StatusFor(r.Status)
	srv.LastJobID, srv.LastError = r.JobID, r.Error
	switch {
	case to == StatusReady:
		srv.Attempts = 0
	case countAttempt:
		srv.Attempts++
	}
	reason := resultReason(r)
	from := srv.Status
	if from == StatusOrphaned {
		srv.OrphanedFrom = to
		return []History{{Event: EventResult, From: from, To: from, Reason: reason + " (server is ORPHANED)", JobID: r.JobID, Actor: actor}}
	}
	if from == to {
		return nil
	}
	srv.Status = to
	return []History{{Event: EventResult, From: from, To: to, Reason: reason, JobID: r.JobID, Actor: actor}}
}

// resultReason is a result's history reason: status, error, summary.
func resultReason(r Result) string {
	reason := string(r.Status)
	if r.Error != "" {
		reason += ": " + r.Error
	}
	if r.Summary != "" {
		reason += " (" + r.Summary + ")"
	}
	return reason
}

// Summary describes a provisioning result's run for the history: each
// playbook with its outcome (or the playbook), the failed task.
func Summary(res *messages.ProvisionerResult) string {
	var parts []string
	switch {
	case len(res.Playbooks) > 0:
		steps := make([]string, len(res.Playbooks))
		for i, p := range res.Playbooks {
			steps[i] = p.Playbook + " " + string(p.Status)
		}
		parts = append(parts, "playbooks: "+strings.Join(steps, ", "))
	case res.Playbook != "":
		parts = append(parts, "playbook "+res.Playbook)
	}
	if ft := res.FailedTask; ft != nil && ft.Name != "" {
		parts = append(parts, "failed task "+ft.Name)
	}
	return strings.Join(parts, ", ")
}

// ResultOf is the Result of a provisioning result message, with its
// Summary; the error message falls back to the error's kind.
func ResultOf(res *messages.ProvisionerResult) Result {
	r := Result{Handle: res.ServerHandle, JobID: res.JobID, Status: res.Status, Summary: Summary(res)}
	if res.Error != nil {
		r.Error, r.ErrorKind = res.Error.Message, res.Error.Kind
		if r.Error == "" {
			r.Error = string(res.Error.Kind)
		}
	}
	return r
}
