package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statuses of a server (servers.status).
const (
	ServerNew          = "NEW"
	ServerQueued       = "QUEUED"
	ServerProvisioning = "PROVISIONING"
	ServerReady        = "READY"
	ServerFailed       = "FAILED"
	ServerUnreachable  = "UNREACHABLE"
	ServerOrphaned     = "ORPHANED"
)

// Server is a row of the servers table. Nullable text columns read as ""
// when NULL (the field docs say what "" means); HostKeyPinnedAt is the zero
// time when NULL.
type Server struct {
	Handle  string
	Address string
	SSHPort int
	SSHUser string
	Status  string
	Labels  map[string]string
	// Source is where the server came from: "manual", "static:<file>", "time4vps".
	Source string
	// ProviderID is the server's id at its provider; "" for none.
	ProviderID string
	// SSHKeyRef is the secret reference of the SSH private key; "" means
	// the service's default key.
	SSHKeyRef string
	// HostKey is the pinned SSH host key (authorized_keys format); "" when
	// none is pinned yet.
	HostKey         string
	HostKeyPinnedAt time.Time
	Attempts        int
	// LastError is the error of the last failed transition; "" for none.
	LastError string
	// LastJobID is the job that last changed the status; "" for none.
	LastJobID string
	// NotifiedStatus is the terminal status last notified about; "" for none.
	NotifiedStatus  string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	StatusChangedAt time.Time
	// Version increases on every update; UpdateServerStatus compares and
	// sets on it.
	Version int64
}

const serverColumns = `handle, address, ssh_port, ssh_user, status, labels, source,
	COALESCE(provider_id, ''), COALESCE(ssh_key_ref, ''), COALESCE(host_key, ''), host_key_pinned_at,
	attempts, COALESCE(last_error, ''), COALESCE(last_job_id, ''), COALESCE(notified_status, ''),
	created_at, updated_at, status_changed_at, version`

func scanServer(row pgx.Row) (*Server, error) {
	var s Server
	var pinnedAt *time.Time
	err := row.Scan(&s.Handle, &s.Address, &s.SSHPort, &s.SSHUser, &s.Status, &s.Labels, &s.Source,
		&s.ProviderID, &s.SSHKeyRef, &s.HostKey, &pinnedAt,
		&s.Attempts, &s.LastError, &s.LastJobID, &s.NotifiedStatus,
		&s.CreatedAt, &s.UpdatedAt, &s.StatusChangedAt, &s.Version)
	if err != nil {
		return nil, err
	}
	if pinnedAt != nil {
		s.HostKeyPinnedAt = *pinnedAt
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	return &s, nil
}

// GetServer reads the server with handle; ErrServerNotFound when there is none.
func GetServer(ctx context.Context, q Querier, handle string) (*Server, error) {
	s, err := scanServer(q.QueryRow(ctx, `SELECT `+serverColumns+` FROM servers WHERE handle = $1`, handle))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read server %s: %w", handle, ErrServerNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read server %s: %w", handle, err)
	}
	return s, nil
}

// AmbiguousAddressError: several registered servers share the address a
// deploy targets, so the address does not say which one is meant.
type AmbiguousAddressError struct {
	Address string
	Handles []string // the servers with the address, sorted
}

func (e *AmbiguousAddressError) Error() string {
	return fmt.Sprintf("address %s belongs to %d servers (%s): target the server by handle",
		e.Address, len(e.Handles), strings.Join(e.Handles, ", "))
}

// FindServerByAddress returns the registered server with address, for
// deploy requests that target an address. It matches the address only: a
// deploy's port is the service's port, not SSH's. Addresses are compared in
// their canonical form (CanonicalAddress): "2001:DB8::0:1" finds
// "2001:db8::1" and "::ffff:192.0.2.1" finds "192.0.2.1".
// ErrServerNotFound when no server has the address (the target is then an
// unregistered host); *AmbiguousAddressError when several have it;
// ErrInvalidAddress when address is not an address at all.
func FindServerByAddress(ctx context.Context, q Querier, address string) (*Server, error) {
	canonical, err := CanonicalAddress(address)
	if err != nil {
		return nil, fmt.Errorf("find server by address: %w", err)
	}
	rows, err := q.Query(ctx, `SELECT `+serverColumns+` FROM servers WHERE address = $1 ORDER BY handle`, canonical)
	if err != nil {
		return nil, fmt.Errorf("find server by address %s: %w", canonical, err)
	}
	servers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Server, error) { return scanServer(r) })
	if err != nil {
		return nil, fmt.Errorf("find server by address %s: %w", canonical, err)
	}
	switch len(servers) {
	case 0:
		return nil, fmt.Errorf("find server by address %s: %w", canonical, ErrServerNotFound)
	case 1:
		return servers[0], nil
	}
	handles := make([]string, len(servers))
	for i, s := range servers {
		handles[i] = s.Handle
	}
	return nil, &AmbiguousAddressError{Address: canonical, Handles: handles}
}

// SSHKeyRefs returns the distinct SSH key references (servers.ssh_key_ref)
// of the registered servers: the service's own credentials, which no
// request may ask to resolve.
func SSHKeyRefs(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT ssh_key_ref FROM servers WHERE ssh_key_ref IS NOT NULL ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list ssh key refs: %w", err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list ssh key refs: %w", err)
	}
	return refs, nil
}

// UpdateServerStatus sets the status of the server with handle if its
// version is still fromVersion (compare and set) and returns the new
// version. lastError nil clears last_error; jobID "" keeps last_job_id.
// ErrVersionConflict when the row changed since it was read (re-read and
// decide again, or use TransitionServer); ErrServerNotFound when it is gone.
func UpdateServerStatus(ctx context.Context, q Querier, handle string, fromVersion int64, status string, lastError *string, jobID string) (int64, error) {
	s, err := casServerStatus(ctx, q, handle, fromVersion, status, lastError, jobID)
	if err != nil {
		return 0, err
	}
	return s.Version, nil
}

func casServerStatus(ctx context.Context, q Querier, handle string, fromVersion int64, status string, lastError *string, jobID string) (*Server, error) {
	s, err := scanServer(q.QueryRow(ctx, `
		UPDATE servers SET status = $3, last_error = $4, last_job_id = COALESCE(NULLIF($5, ''), last_job_id)
		WHERE handle = $1 AND version = $2
		RETURNING `+serverColumns, handle, fromVersion, status, lastError, jobID))
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("set server %s status %s: %w", handle, status, err)
	}
	if err := serverExists(ctx, q, handle); err != nil {
		return nil, fmt.Errorf("set server %s status %s: %w", handle, status, err)
	}
	return nil, fmt.Errorf("set server %s status %s from version %d: %w", handle, status, fromVersion, ErrVersionConflict)
}

// serverExists returns nil when the server exists, ErrServerNotFound when
// it does not.
func serverExists(ctx context.Context, q Querier, handle string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM servers WHERE handle = $1)`, handle).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return ErrServerNotFound
	}
	return nil
}

// transitionTries bounds TransitionServer's read-decide-write loop.
const transitionTries = 5

// TransitionFunc decides a server's next status from its current row (a
// copy it may not keep). ok false leaves the server unchanged.
type TransitionFunc func(s *Server) (newStatus string, lastErr *string, ok bool)

// TransitionServer reads the server, asks decide for its next status and
// writes it with UpdateServerStatus; when someone else changed the row in
// between it reads again and asks decide again, at most a few times (then
// ErrVersionConflict). It returns the server as written, or as read when
// decide declined (changed false). jobID "" keeps last_job_id. A change of
// status is recorded in server_history (event "transition", actor
// HistoryActor) by the same statement.
func TransitionServer(ctx context.Context, q Querier, handle, jobID string, decide TransitionFunc) (s *Server, changed bool, err error) {
	for range transitionTries {
		cur, err := GetServer(ctx, q, handle)
		if err != nil {
			return nil, false, err
		}
		view := *cur
		view.Labels = make(map[string]string, len(cur.Labels))
		for k, v := range cur.Labels {
			view.Labels[k] = v
		}
		status, lastErr, ok := decide(&view)
		if !ok {
			return cur, false, nil
		}
		next, err := casServerStatusLogged(ctx, q, cur, status, lastErr, jobID)
		if errors.Is(err, ErrVersionConflict) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		return next, true, nil
	}
	return nil, false, fmt.Errorf("transition server %s: gave up after %d tries: %w", handle, transitionTries, ErrVersionConflict)
}

// IncrementAttempts adds one to the server's attempts and returns the new
// count and row version.
func IncrementAttempts(ctx context.Context, q Querier, handle string) (attempts int, version int64, err error) {
	err = q.QueryRow(ctx, `UPDATE servers SET attempts = attempts + 1 WHERE handle = $1 RETURNING attempts, version`, handle).
		Scan(&attempts, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("increment attempts of server %s: %w", handle, ErrServerNotFound)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("increment attempts of server %s: %w", handle, err)
	}
	return attempts, version, nil
}

// ResetAttempts sets the server's attempts back to zero (after a success).
func ResetAttempts(ctx context.Context, q Querier, handle string) error {
	return execOnServer(ctx, q, handle, "reset attempts of",
		`UPDATE servers SET attempts = 0 WHERE handle = $1 AND attempts <> 0`)
}

// SetServerAddress records the server's address as its provider reports it,
// in canonical form (CanonicalAddress; ErrInvalidAddress for anything
// else). It writes (and bumps the version) only when the address differs;
// changed says whether it did.
func SetServerAddress(ctx context.Context, q Querier, handle, address string) (changed bool, err error) {
	canonical, err := CanonicalAddress(address)
	if err != nil {
		return false, fmt.Errorf("set address of server %s: %w", handle, err)
	}
	return setServerText(ctx, q, handle, "address", canonical)
}

// SetServerSSHUser sets the user the server is reached as over SSH (after
// setup created the deploy user and disabled root login). It reports
// whether the user changed.
func SetServerSSHUser(ctx context.Context, q Querier, handle, user string) (changed bool, err error) {
	return setServerText(ctx, q, handle, "ssh_user", user)
}

// setServerText sets one text column of a server when its value differs.
// column is one of a fixed set, never input.
func setServerText(ctx context.Context, q Querier, handle, column, value string) (bool, error) {
	switch column {
	case "address", "ssh_user":
	default:
		return false, fmt.Errorf("set %s of server %s: not a settable column", column, handle)
	}
	tag, err := q.Exec(ctx, `UPDATE servers SET `+column+` = $2 WHERE handle = $1 AND `+column+` IS DISTINCT FROM $2`, handle, value)
	if err != nil {
		return false, fmt.Errorf("set %s of server %s: %w", column, handle, err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	if err := serverExists(ctx, q, handle); err != nil {
		return false, fmt.Errorf("set %s of server %s: %w", column, handle, err)
	}
	return false, nil
}

// PinServerHostKey pins key (authorized_keys format) as the server's SSH
// host key if none is pinned yet (trust on first use) and returns the key
// pinned now: key itself, or the key pinned before, maybe a moment ago by
// another instance. A caller whose key differs from the returned one saw a
// different host than the first pinner and must not trust it.
func PinServerHostKey(ctx context.Context, q Querier, handle, key string) (pinned string, err error) {
	key = strings.TrimSpace(key)
	if key == "" {
		return "", fmt.Errorf("pin host key of server %s: empty key", handle)
	}
	// Under READ COMMITTED a concurrent pinner's UPDATE waits for this row
	// lock, then re-checks host_key IS NULL against the committed row and
	// updates nothing; the SELECT below then sees the winner's key.
	err = q.QueryRow(ctx, `UPDATE servers SET host_key = $2, host_key_pinned_at = now()
		WHERE handle = $1 AND host_key IS NULL RETURNING host_key`, handle, key).Scan(&pinned)
	if err == nil {
		return pinned, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("pin host key of server %s: %w", handle, err)
	}
	var current *string
	err = q.QueryRow(ctx, `SELECT host_key FROM servers WHERE handle = $1`, handle).Scan(&current)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("pin host key of server %s: %w", handle, ErrServerNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("pin host key of server %s: %w", handle, err)
	}
	if current == nil { // cleared again in between; should not happen in practice
		return "", fmt.Errorf("pin host key of server %s: key cleared concurrently: %w", handle, ErrVersionConflict)
	}
	return *current, nil
}

// ClearServerHostKey forgets the server's pinned host key, after a
// reinstall gave it a new one; the next connection pins again.
func ClearServerHostKey(ctx context.Context, q Querier, handle string) error {
	return execOnServer(ctx, q, handle, "clear host key of",
		`UPDATE servers SET host_key = NULL, host_key_pinned_at = NULL WHERE handle = $1 AND host_key IS NOT NULL`)
}

// execOnServer runs an idempotent update of one server (sql takes the
// handle as $1 and may match no row when there is nothing to change) and
// reports ErrServerNotFound when the server does not exist.
func execOnServer(ctx context.Context, q Querier, handle, what, sql string) error {
	tag, err := q.Exec(ctx, sql, handle)
	if err != nil {
		return fmt.Errorf("%s server %s: %w", what, handle, err)
	}
	if tag.RowsAffected() == 0 {
		if err := serverExists(ctx, q, handle); err != nil {
			return fmt.Errorf("%s server %s: %w", what, handle, err)
		}
	}
	return nil
}
