package fleet

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// The statuses of a server (the same as pkg/store's).
const (
	StatusNew          = store.ServerNew
	StatusQueued       = store.ServerQueued
	StatusProvisioning = store.ServerProvisioning
	StatusReady        = store.ServerReady
	StatusFailed       = store.ServerFailed
	StatusUnreachable  = store.ServerUnreachable
	StatusOrphaned     = store.ServerOrphaned
)

// Statuses returns every status, in lifecycle order.
func Statuses() []string {
	return []string{StatusNew, StatusQueued, StatusProvisioning, StatusReady, StatusFailed, StatusUnreachable, StatusOrphaned}
}

// ValidStatus reports whether s is one of Statuses.
func ValidStatus(s string) bool { return slices.Contains(Statuses(), s) }

// Action is what a job does to a server.
type Action string

// The actions of a job; operators request them with RequestAction.
const (
	// ActionProvision runs setup (plus the server's extra playbooks).
	ActionProvision Action = "provision"
	// ActionRecovery runs the recovery playbook (is_recovery).
	ActionRecovery Action = "recovery"
	// ActionRebuild reinstalls the server (force_reinstall), then sets it up.
	ActionRebuild Action = "rebuild"
)

// Valid reports whether a is one of the actions.
func (a Action) Valid() bool {
	return a == ActionProvision || a == ActionRecovery || a == ActionRebuild
}

// Errors of the package's operations (wrapped with context); test with
// errors.Is. ErrNotFound and ErrConflict are pkg/store's, so either
// package's sentinel matches.
var (
	// ErrNotFound: no server has the handle.
	ErrNotFound = store.ErrServerNotFound
	// ErrConflict: the server changed concurrently too often (or since the
	// version the caller gave); read it again and retry.
	ErrConflict = store.ErrVersionConflict
	// ErrInvalid: an argument is invalid (unknown action or status, bad
	// filter, empty actor); the message says which.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotAllowed: the operation does not apply to the server in its
	// current state (for example a request on an ORPHANED server).
	ErrNotAllowed = errors.New("operation not allowed in the server's state")
)

// Server is a server as the fleet sees it: the servers row (store.Server,
// what infra and the deployer read) with the scheduler's columns. It is the
// one type whose status, attempts and last error change, through this
// package.
type Server struct {
	store.Server
	// Paused servers are left out of the reconcile loop and health checks.
	Paused bool
	// RequestedAction is an open request (operator or health check); ""
	// for none. RequestedBy and RequestedAt say who asked and when.
	RequestedAction Action
	RequestedBy     string
	RequestedAt     time.Time
	// PendingJobID is the job the server waits for; "" when none is in
	// flight. PendingAction is what it does; QueuedAt when it was queued.
	PendingJobID  string
	PendingAction Action
	QueuedAt      time.Time
	// NextAttemptAt is the earliest time the loop acts on the server by
	// itself again (retry backoff, cool-down); zero for now.
	NextAttemptAt time.Time
	// RetriesExhausted: FAILED with no retry left; only a request moves it.
	RetriesExhausted bool
	// LastRecoveryAt is when a recovery was last queued (health cool-down).
	LastRecoveryAt time.Time
	// LastSeenAt is when the server's source last listed it.
	LastSeenAt time.Time
	// OrphanedFrom is the status the server had when it became ORPHANED.
	OrphanedFrom string
	// SourceHash fingerprints what the source last said about the server.
	SourceHash string
}

const serverColumns = store.ServerColumns + `,
	paused, COALESCE(requested_action, ''), COALESCE(requested_by, ''), requested_at,
	COALESCE(pending_job_id, ''), COALESCE(pending_action, ''), queued_at, next_attempt_at,
	retries_exhausted, last_recovery_at, last_seen_at, COALESCE(orphaned_from, ''), COALESCE(source_hash, '')`

// scanServer reads a row of serverColumns: the servers row as pkg/store
// reads it (store.ScanServer), then the scheduler's columns.
func scanServer(row pgx.Row) (*Server, error) {
	var s Server
	var reqAt, queuedAt, nextAt, recAt, seenAt *time.Time
	var reqAction, pendAction string
	err := store.ScanServer(row, &s.Server,
		&s.Paused, &reqAction, &s.RequestedBy, &reqAt,
		&s.PendingJobID, &pendAction, &queuedAt, &nextAt,
		&s.RetriesExhausted, &recAt, &seenAt, &s.OrphanedFrom, &s.SourceHash)
	if err != nil {
		return nil, err
	}
	s.RequestedAction, s.PendingAction = Action(reqAction), Action(pendAction)
	for _, p := range []struct {
		src *time.Time
		dst *time.Time
	}{{reqAt, &s.RequestedAt}, {queuedAt, &s.QueuedAt},
		{nextAt, &s.NextAttemptAt}, {recAt, &s.LastRecoveryAt}, {seenAt, &s.LastSeenAt}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return &s, nil
}

// Store runs the fleet's operations on a Postgres pool.
type Store struct {
	db  *pgxpool.Pool
	now func() time.Time
}

// Options tune a Store; the zero value is ready to use.
type Options struct {
	// Now is the clock (default time.Now). Times written by the package
	// come from it, so tests can move it.
	Now func() time.Time
}

// New returns a Store on db.
func New(db *pgxpool.Pool, opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{db: db, now: opts.Now}
}

// DB returns the pool the Store works on.
func (s *Store) DB() *pgxpool.Pool { return s.db }

// Get reads one server; ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, handle string) (*Server, error) {
	return getServer(ctx, s.db, handle, false)
}

func getServer(ctx context.Context, q store.Querier, handle string, forUpdate bool) (*Server, error) {
	sql := `SELECT ` + serverColumns + ` FROM servers WHERE handle = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	srv, err := scanServer(q.QueryRow(ctx, sql, handle))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("server %s: %w", handle, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read server %s: %w", handle, err)
	}
	return srv, nil
}

// Filter selects servers for List and Count. Zero fields select all.
type Filter struct {
	// Statuses keeps servers in any of these statuses.
	Statuses []string
	// Source keeps servers from this source ("manual", "static:<file>",
	// "time4vps", "ec2:<name>"); a trailing '*' matches a prefix.
	Source string
	// Labels keeps servers having every one of these labels; a value of
	// "*" only asks that the label exists.
	Labels map[string]string
	// Search keeps servers whose handle or address contains it (case
	// insensitive).
	Search string
	// Paused, when set, keeps only paused (true) or unpaused servers.
	Paused *bool
	// Requested keeps servers with an open request.
	Requested bool
	// Project keeps the servers this project (a canonical project id)
	// owns; "-" keeps fleet-only servers (owned by no project).
	Project string
	// Order is the order of List's pages (Count ignores it).
	Order Order
}

// Order is an order of List: by handle (the zero value), or by one of the
// columns an operator triages with, the handle breaking ties.
type Order string

// The orders of List.
const (
	OrderHandle   Order = ""
	OrderStatus   Order = "status"   // status (alphabetical), then handle
	OrderAttempts Order = "attempts" // most attempts first
	OrderChanged  Order = "changed"  // latest status change first
)

// Orders are the orders List takes, by their names (handle for the zero
// value).
func Orders() []string {
	return []string{"handle", string(OrderStatus), string(OrderAttempts), string(OrderChanged)}
}

// orderSQL is order's ORDER BY, and its keyset condition after a row
// whose sort value is $v and handle $h (the placeholders given).
func (o Order) orderSQL(v, h string) (by, after string, err error) {
	switch o {
	case OrderHandle:
		return "handle", "handle > " + h + " AND " + v + " = ''", nil
	case OrderStatus:
		return "status, handle", "(status, handle) > (" + v + ", " + h + ")", nil
	case OrderAttempts:
		return "attempts DESC, handle", "(attempts < " + v + "::int OR (attempts = " + v + "::int AND handle > " + h + "))", nil
	case OrderChanged:
		return "status_changed_at DESC, handle", "(status_changed_at < " + v + "::timestamptz OR (status_changed_at = " + v +
			"::timestamptz AND handle > " + h + "))", nil
	}
	return "", "", fmt.Errorf("%w: unknown order %q (want one of %s)", ErrInvalid, o, strings.Join(Orders(), ", "))
}

// sortValue is s's value in order o, as a cursor holds it.
func (o Order) sortValue(s *Server) string {
	switch o {
	case OrderStatus:
		return s.Status
	case OrderAttempts:
		return strconv.Itoa(s.Attempts)
	case OrderChanged:
		return s.StatusChangedAt.UTC().Format(time.RFC3339Nano)
	}
	return ""
}

// cursor is the cursor of the page after s: its handle in handle order
// (as ever), otherwise its sort value and handle, base64url-encoded.
func (o Order) cursor(s *Server) string {
	if o == OrderHandle {
		return s.Handle
	}
	return base64.RawURLEncoding.EncodeToString([]byte(o.sortValue(s) + "\n" + s.Handle))
}

// ErrBadCursor: List's cursor is not one of its order's (it also matches
// ErrInvalid).
var ErrBadCursor = errors.New("not a cursor of this order")

// parseCursor reads a cursor of order o: the sort value and the handle.
func (o Order) parseCursor(c string) (v, h string, err error) {
	if o == OrderHandle || c == "" {
		return "", c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		var ok bool
		if v, h, ok = strings.Cut(string(b), "\n"); ok {
			return v, h, nil
		}
	}
	return "", "", fmt.Errorf("%w: %w: %q", ErrInvalid, ErrBadCursor, c)
}

// MaxPageSize is the largest page List returns.
const MaxPageSize = 1000

// DefaultPageSize is List's page size when none is given.
const DefaultPageSize = 100

// Page is one page of List: servers ordered by handle, and Next, the cursor
// of the next page ("" on the last page).
type Page struct {
	Servers []*Server
	Next    string
}

var labelKeyRE = pattern.MustCompile(`^[A-Za-z0-9_.:/-]+$`, 128)

// where builds the WHERE clause of f with its arguments.
func (f Filter) where() (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if len(f.Statuses) > 0 {
		for _, st := range f.Statuses {
			if !ValidStatus(st) {
				return "", nil, fmt.Errorf("%w: unknown status %q (want one of %s)", ErrInvalid, st, strings.Join(Statuses(), ", "))
			}
		}
		conds = append(conds, "status = ANY("+arg(f.Statuses)+")")
	}
	if f.Source != "" {
		if p, ok := strings.CutSuffix(f.Source, "*"); ok {
			conds = append(conds, "starts_with(source, "+arg(p)+")")
		} else {
			conds = append(conds, "source = "+arg(f.Source))
		}
	}
	for k, v := range f.Labels {
		if !labelKeyRE.MatchString(k) {
			return "", nil, fmt.Errorf("%w: label key %q", ErrInvalid, k)
		}
		if v == "*" {
			conds = append(conds, "labels ? "+arg(k))
		} else {
			conds = append(conds, "labels @> "+arg(map[string]string{k: v}))
		}
	}
	if f.Search != "" {
		p := "%" + strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(f.Search) + "%"
		a := arg(p)
		conds = append(conds, "(handle ILIKE "+a+" OR address ILIKE "+a+")")
	}
	if f.Paused != nil {
		conds = append(conds, "paused = "+arg(*f.Paused))
	}
	if f.Requested {
		conds = append(conds, "requested_action IS NOT NULL")
	}
	switch f.Project {
	case "":
	case "-":
		conds = append(conds, "projects = '{}'")
	default:
		conds = append(conds, "projects @> ARRAY["+arg(f.Project)+"]::text[]")
	}
	if len(conds) == 0 {
		return "TRUE", args, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

// List returns the servers matching f in f.Order (by handle by default),
// at most limit of them (DefaultPageSize when 0, at most MaxPageSize),
// starting after the cursor after ("" for the first page; a cursor only
// fits the order it came from).
func (s *Store) List(ctx context.Context, f Filter, after string, limit int) (*Page, error) {
	switch {
	case limit == 0:
		limit = DefaultPageSize
	case limit < 0 || limit > MaxPageSize:
		return nil, fmt.Errorf("%w: limit %d not in 1..%d", ErrInvalid, limit, MaxPageSize)
	}
	where, args, err := f.where()
	if err != nil {
		return nil, err
	}
	v, h, err := f.Order.parseCursor(after)
	if err != nil {
		return nil, err
	}
	by, keyset, err := f.Order.orderSQL(fmt.Sprintf("$%d::text", len(args)+1), fmt.Sprintf("$%d::text", len(args)+2))
	if err != nil {
		return nil, err
	}
	cond := "TRUE"
	if after != "" {
		cond = keyset
		args = append(args, v, h)
	}
	args = append(args, limit+1)
	sql := fmt.Sprintf(`SELECT %s FROM servers WHERE %s AND %s ORDER BY %s LIMIT $%d`,
		serverColumns, where, cond, by, len(args))
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	servers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Server, error) { return scanServer(r) })
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	page := &Page{Servers: servers}
	if len(servers) > limit {
		page.Servers = servers[:limit]
		page.Next = f.Order.cursor(servers[limit-1])
	}
	return page, nil
}

// Count returns how many servers matching f are in each status; every
// status is present (0 when none).
func (s *Store) Count(ctx context.Context, f Filter) (map[string]int, error) {
	where, args, err := f.where()
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT status, count(*) FROM servers WHERE `+where+` GROUP BY status`, args...)
	if err != nil {
		return nil, fmt.Errorf("count servers: %w", err)
	}
	counts := make(map[string]int, len(Statuses()))
	for _, st := range Statuses() {
		counts[st] = 0
	}
	var status string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		counts[status] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count servers: %w", err)
	}
	return counts, nil
}

// Detail is one server with its recent history and runs, newest first.
type Detail struct {
	Server  *Server
	History []History
	Runs    []Run
}

// Run is a run of a job on the server (from infra's runs table), without
// its encoded result.
type Run struct {
	JobID      string
	Kind       string
	Playbook   string
	State      string
	Status     string
	ErrorKind  string
	Attempt    int
	CreatedAt  time.Time
	FinishedAt time.Time
}

// Show returns the server with its last historyLimit history rows and
// runLimit runs (0 means 50 each).
func (s *Store) Show(ctx context.Context, handle string, historyLimit, runLimit int) (*Detail, error) {
	if historyLimit <= 0 {
		historyLimit = 50
	}
	if runLimit <= 0 {
		runLimit = 50
	}
	srv, err := s.Get(ctx, handle)
	if err != nil {
		return nil, err
	}
	hist, err := s.History(ctx, handle, historyLimit)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT job_id, kind, COALESCE(playbook, ''), state, COALESCE(status, ''),
		COALESCE(error_kind, ''), attempt, created_at, finished_at
		FROM runs WHERE server_handle = $1 ORDER BY created_at DESC LIMIT $2`, handle, runLimit)
	if err != nil {
		return nil, fmt.Errorf("runs of server %s: %w", handle, err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) {
		var run Run
		var fin *time.Time
		err := r.Scan(&run.JobID, &run.Kind, &run.Playbook, &run.State, &run.Status, &run.ErrorKind,
			&run.Attempt, &run.CreatedAt, &fin)
		if fin != nil {
			run.FinishedAt = *fin
		}
		return run, err
	})
	if err != nil {
		return nil, fmt.Errorf("runs of server %s: %w", handle, err)
	}
	return &Detail{Server: srv, History: hist, Runs: runs}, nil
}

// RunKinds are the kinds of runs in the runs table.
const (
	RunKindProvision = "provision"
	RunKindDeploy    = "deploy"
)

// RunFilter selects runs for Runs. Zero fields do not filter.
type RunFilter struct {
	Kind   string // provision or deploy
	Status string // a final status, or "running"
	Server string // a server handle
	// Before, when set, keeps the runs strictly before (BeforeAt,
	// BeforeID) in the order of Runs (created_at, job_id descending);
	// Until, when set, the runs created before it.
	BeforeAt time.Time
	BeforeID string
	Until    time.Time
	Since    time.Time
}

// Runs returns up to limit runs, newest first (created_at, job_id), with
// their servers: the fleet's runs as infra recorded them.
func (s *Store) Runs(ctx context.Context, f RunFilter, limit int) ([]RunOf, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Kind != "" {
		where = append(where, "kind = "+arg(f.Kind))
	}
	switch f.Status {
	case "":
	case "running":
		where = append(where, "state = 'running'")
	default:
		where = append(where, "status = "+arg(f.Status))
	}
	if f.Server != "" {
		where = append(where, "server_handle = "+arg(f.Server))
	}
	if !f.BeforeAt.IsZero() {
		where = append(where, "(created_at, job_id) < ("+arg(f.BeforeAt)+", "+arg(f.BeforeID)+")")
	}
	if !f.Until.IsZero() {
		where = append(where, "created_at < "+arg(f.Until))
	}
	if !f.Since.IsZero() {
		where = append(where, "created_at >= "+arg(f.Since))
	}
	sql := `SELECT job_id, kind, COALESCE(playbook, ''), state, COALESCE(status, ''), COALESCE(error_kind, ''),
		attempt, created_at, finished_at, COALESCE(server_handle, ''), target FROM runs`
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY created_at DESC, job_id DESC LIMIT " + arg(limit)
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunOf, error) {
		var run RunOf
		var fin *time.Time
		err := r.Scan(&run.JobID, &run.Kind, &run.Playbook, &run.State, &run.Status, &run.ErrorKind,
			&run.Attempt, &run.CreatedAt, &fin, &run.Server, &run.Target)
		if fin != nil {
			run.FinishedAt = *fin
		}
		return run, err
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

// RunOf is a run with the server or target it ran on.
type RunOf struct {
	Run
	Server string // the server's handle; "" for an unregistered target
	Target string
}

// RunResult returns one run and its encoded result (nil while it runs):
// ErrNotFound when no run has jobID.
func (s *Store) RunResult(ctx context.Context, jobID string) (*RunOf, []byte, error) {
	var run RunOf
	var fin *time.Time
	var result []byte
	err := s.db.QueryRow(ctx, `SELECT job_id, kind, COALESCE(playbook, ''), state, COALESCE(status, ''),
		COALESCE(error_kind, ''), attempt, created_at, finished_at, COALESCE(server_handle, ''), target, result
		FROM runs WHERE job_id = $1`, jobID).Scan(&run.JobID, &run.Kind, &run.Playbook, &run.State, &run.Status,
		&run.ErrorKind, &run.Attempt, &run.CreatedAt, &fin, &run.Server, &run.Target, &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("run %s: %w", jobID, ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", jobID, err)
	}
	if fin != nil {
		run.FinishedAt = *fin
	}
	return &run, result, nil
}

// HourlyRuns counts the runs of kind created since since by hour (UTC,
// truncated) and outcome: a final status, or "running".
func (s *Store) HourlyRuns(ctx context.Context, kind string, since time.Time) (map[time.Time]map[string]int, error) {
	out, err := store.Hourly(ctx, s.db, `SELECT date_trunc('hour', created_at), COALESCE(status, 'running'), count(*)
		FROM runs WHERE kind = $1 AND created_at >= $2 GROUP BY 1, 2`, kind, since)
	if err != nil {
		return nil, fmt.Errorf("hourly runs: %w", err)
	}
	return out, nil
}
