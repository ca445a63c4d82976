package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// nullTime maps the zero time to NULL.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// writeQuery is the statement that writes srv: compare-and-set on its
// version, returning the server as written (read it with scanWritten).
func writeQuery(srv *Server) (string, []any) {
	return `UPDATE servers SET
		status = $3, last_error = NULLIF($4, ''), last_job_id = NULLIF($5, ''), attempts = $6,
		notified_status = NULLIF($7, ''), paused = $8, requested_action = NULLIF($9, ''),
		requested_by = NULLIF($10, ''), requested_at = $11, pending_job_id = NULLIF($12, ''),
		pending_action = NULLIF($13, ''), queued_at = $14, next_attempt_at = $15,
		retries_exhausted = $16, last_recovery_at = $17, orphaned_from = NULLIF($18, ''), projects = $19
		WHERE handle = $1 AND version = $2 RETURNING ` + serverColumns, []any{
			srv.Handle, srv.Version, srv.Status, srv.LastError, srv.LastJobID, srv.Attempts,
			srv.NotifiedStatus, srv.Paused, string(srv.RequestedAction),
			srv.RequestedBy, nullTime(srv.RequestedAt), srv.PendingJobID,
			string(srv.PendingAction), nullTime(srv.QueuedAt), nullTime(srv.NextAttemptAt),
			srv.RetriesExhausted, nullTime(srv.LastRecoveryAt), srv.OrphanedFrom, projectsOf(srv)}
}

// scanWritten reads writeQuery's answer: the server as written, or
// ErrConflict.
func scanWritten(srv *Server, row pgx.Row) (*Server, error) {
	out, err := scanServer(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("update server %s from version %d: %w", srv.Handle, srv.Version, ErrConflict)
	}
	if err != nil {
		return nil, fmt.Errorf("update server %s: %w", srv.Handle, err)
	}
	return out, nil
}

// change runs fn on the server, read and locked in a transaction on the
// Store's pool; see changeIn.
func (s *Store) change(ctx context.Context, handle string, fn func(tx pgx.Tx, srv *Server) ([]History, error)) (*Server, error) {
	return s.changeIn(ctx, s.db, handle, fn)
}

// beginner starts a transaction: a pool, or a transaction (a savepoint).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// changeIn is the one transition of a server: it runs fn on the server,
// read and locked in a transaction of db, and commits what fn did. fn
// changes srv and returns the history rows to write; the server is written
// by compare-and-set on its version when a column changed, with the rows
// in the same transaction and the same round trip (a batch). The
// transaction holds the row lock, so other writers wait and then see a new
// version. db may be a caller's transaction (infra's, storing a run's
// result with it): the change then runs in it, without a savepoint, and an
// error means the caller must roll it back.
func (s *Store) changeIn(ctx context.Context, db beginner, handle string, fn func(tx pgx.Tx, srv *Server) ([]History, error)) (*Server, error) {
	var out *Server
	change := func(tx pgx.Tx) error {
		srv, err := getServer(ctx, tx, handle, true)
		if err != nil {
			return err
		}
		before := *srv
		hist, err := fn(tx, srv)
		if err != nil {
			return err
		}
		out = srv
		written := changed(&before, srv)
		if !written && len(hist) == 0 {
			return nil
		}
		b := &pgx.Batch{}
		if written {
			sql, args := writeQuery(srv)
			b.Queue(sql, args...)
		}
		now := s.now()
		for _, h := range hist {
			h.Handle = handle
			sql, args := historyQuery(h, now)
			b.Queue(sql, args...)
		}
		br := tx.SendBatch(ctx, b)
		defer br.Close()
		if written {
			if out, err = scanWritten(srv, br.QueryRow()); err != nil {
				return err
			}
		}
		for range hist {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("record history of server %s: %w", handle, err)
			}
		}
		return br.Close()
	}
	var err error
	if tx, ok := db.(pgx.Tx); ok {
		err = change(tx)
	} else {
		err = pgx.BeginFunc(ctx, db, change)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// changed reports whether a scheduler-owned column differs.
func changed(a, b *Server) bool {
	return a.Status != b.Status || a.LastError != b.LastError || a.LastJobID != b.LastJobID ||
		a.Attempts != b.Attempts || a.NotifiedStatus != b.NotifiedStatus || a.Paused != b.Paused ||
		a.RequestedAction != b.RequestedAction || a.RequestedBy != b.RequestedBy ||
		!a.RequestedAt.Equal(b.RequestedAt) || a.PendingJobID != b.PendingJobID ||
		a.PendingAction != b.PendingAction || !a.QueuedAt.Equal(b.QueuedAt) ||
		!a.NextAttemptAt.Equal(b.NextAttemptAt) || a.RetriesExhausted != b.RetriesExhausted ||
		!a.LastRecoveryAt.Equal(b.LastRecoveryAt) || a.OrphanedFrom != b.OrphanedFrom ||
		!slices.Equal(a.Projects, b.Projects)
}

// projectsOf is the server's projects for the projects column (never NULL).
func projectsOf(srv *Server) []string {
	if srv.Projects == nil {
		return []string{}
	}
	return srv.Projects
}

func checkActor(actor string) error {
	if strings.TrimSpace(actor) == "" || len(actor) > 200 {
		return fmt.Errorf("%w: actor must be 1-200 characters", ErrInvalid)
	}
	return nil
}

// TransitionRequest is a status change asked of Transition.
type TransitionRequest struct {
	Handle string
	// Version, when not 0, is the version the caller read: the change is
	// made only if the server is still at it (else ErrConflict).
	Version int64
	// From, when not empty, lists the statuses the change is allowed from
	// (else ErrNotAllowed).
	From []string
	To   string
	// Reason says why; JobID names the job it is about (may be "").
	Reason string
	JobID  string
	// Actor says who: "scheduler", "infra", an operator's name.
	Actor string
	// Error is recorded as the server's last error ("" clears it).
	Error string
}

// Transition moves a server to another status by compare-and-set, with its
// history row, and queues a notification when the new status is notifiable
// (READY, UNREACHABLE) and not yet notified. It is the general door for
// changes the specific operations do not cover (for example infra marking a
// server UNREACHABLE).
func (s *Store) Transition(ctx context.Context, t TransitionRequest) (*Server, error) {
	if !ValidStatus(t.To) {
		return nil, fmt.Errorf("%w: unknown status %q", ErrInvalid, t.To)
	}
	if err := checkActor(t.Actor); err != nil {
		return nil, err
	}
	return s.change(ctx, t.Handle, func(tx pgx.Tx, srv *Server) ([]History, error) {
		if t.Version != 0 && srv.Version != t.Version {
			return nil, fmt.Errorf("transition server %s: version %d, not %d: %w", srv.Handle, srv.Version, t.Version, ErrConflict)
		}
		if len(t.From) > 0 && !containsStr(t.From, srv.Status) {
			return nil, fmt.Errorf("transition server %s to %s: it is %s, not %s: %w",
				srv.Handle, t.To, srv.Status, strings.Join(t.From, " or "), ErrNotAllowed)
		}
		from := srv.Status
		srv.Status, srv.LastError = t.To, t.Error
		if t.JobID != "" {
			srv.LastJobID = t.JobID
		}
		if err := s.maybeNotify(ctx, tx, srv); err != nil {
			return nil, err
		}
		return []History{{Event: EventTransition, From: from, To: t.To, Reason: t.Reason, JobID: t.JobID, Actor: t.Actor}}, nil
	})
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// RequestAction records an operator's request for action on a server
// (provision, recovery, rebuild). The reconcile loop turns it into one
// ProvisionerMessage as soon as no job of the server is in flight (and the
// server is not paused); a newer request replaces an open one. Requests on
// ORPHANED servers are refused (ErrNotAllowed): their source dropped them.
// A FAILED server whose retries were exhausted gets a fresh budget.
func (s *Store) RequestAction(ctx context.Context, handle string, action Action, actor, reason string) (*Server, error) {
	if !action.Valid() {
		return nil, fmt.Errorf("%w: unknown action %q (want provision, recovery or rebuild)", ErrInvalid, action)
	}
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	return s.change(ctx, handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		if srv.Status == StatusOrphaned {
			return nil, fmt.Errorf("request %s of server %s: it is ORPHANED (its source no longer lists it): %w",
				action, handle, ErrNotAllowed)
		}
		srv.RequestedAction, srv.RequestedBy, srv.RequestedAt = action, actor, s.now()
		srv.RetriesExhausted = false
		if srv.Status == StatusFailed {
			srv.Attempts = 0
		}
		r := "requested " + string(action)
		if reason != "" {
			r += ": " + reason
		}
		if srv.Paused {
			r += " (the server is paused: it waits for resume)"
		}
		return []History{{Event: EventRequested, From: srv.Status, To: srv.Status, Reason: r, Actor: actor}}, nil
	})
}

// Pause takes a server out of the reconcile loop and the health checks. A
// job in flight finishes; its result is recorded. Pausing a paused server
// changes nothing.
func (s *Store) Pause(ctx context.Context, handle, actor, reason string) (*Server, error) {
	return s.setPaused(ctx, handle, true, actor, reason)
}

// Resume puts a paused server back into the loop. Resuming a server that is
// not paused changes nothing.
func (s *Store) Resume(ctx context.Context, handle, actor, reason string) (*Server, error) {
	return s.setPaused(ctx, handle, false, actor, reason)
}

func (s *Store) setPaused(ctx context.Context, handle string, paused bool, actor, reason string) (*Server, error) {
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	return s.change(ctx, handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		if srv.Paused == paused {
			return nil, nil
		}
		srv.Paused = paused
		ev := EventResumed
		if paused {
			ev = EventPaused
		}
		return []History{{Event: ev, From: srv.Status, To: srv.Status, Reason: reason, Actor: actor}}, nil
	})
}

// txWithEffect runs fn in a transaction around a side effect outside
// Postgres (a publish to Redis, a message to Slack). fn calls effectDone
// as soon as the effect happened and uses the context it returns from then
// on: the rest of the transaction and its commit run on a context that
// shutdown does not cancel (bounded by a timeout), so a graceful stop never
// loses the record of an effect that already happened.
func txWithEffect(ctx context.Context, db *pgxpool.Pool, fn func(tx pgx.Tx, effectDone func() context.Context) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	cur := ctx
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	effectDone := func() context.Context {
		cur, cancel = context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		return cur
	}
	if err := fn(tx, effectDone); err != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer rcancel()
		_ = tx.Rollback(rctx)
		return err
	}
	if err := tx.Commit(cur); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
