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
	// Version increases on every update; package fleet, the one writer
	// of status, attempts and last error, compares and sets on it.
	Version int64
	// Projects are the projects that own the server (lower-case project
	// ids, sorted): only their deployments and Ansible jobs may target it.
	// Empty: a fleet-only server, owned by no project.
	Projects []string
	// ProjectsFromSource: the server's source sets Projects (a sync writes
	// them, an operator cannot); else an operator does.
	ProjectsFromSource bool
}

// OwnedBy reports whether project (a canonical project id) owns the server.
func (s *Server) OwnedBy(project string) bool {
	for _, p := range s.Projects {
		if p == project {
			return true
		}
	}
	return false
}

// OwnedByOthers reports whether the server has owners and project is not
// one of them: the case infra refuses (a fleet-only server, with no
// owners, is left to the producers' own checks).
func (s *Server) OwnedByOthers(project string) bool {
	return len(s.Projects) > 0 && !s.OwnedBy(project)
}

// ServerColumns are the columns of a Server, in the order ScanServer
// reads them. Package fleet reads the same row with its own columns after
// these, through ScanServer: one piece of code reads a server.
const ServerColumns = `handle, address, ssh_port, ssh_user, status, labels, source,
	COALESCE(provider_id, ''), COALESCE(ssh_key_ref, ''), COALESCE(host_key, ''), host_key_pinned_at,
	attempts, COALESCE(last_error, ''), COALESCE(last_job_id, ''), COALESCE(notified_status, ''),
	created_at, updated_at, status_changed_at, version, projects, projects_from_source`

// ScanServer reads a row of ServerColumns into s, then the row's further
// columns into extra (scan targets of the caller's own columns).
func ScanServer(row pgx.Row, s *Server, extra ...any) error {
	var pinnedAt *time.Time
	dest := append([]any{&s.Handle, &s.Address, &s.SSHPort, &s.SSHUser, &s.Status, &s.Labels, &s.Source,
		&s.ProviderID, &s.SSHKeyRef, &s.HostKey, &pinnedAt,
		&s.Attempts, &s.LastError, &s.LastJobID, &s.NotifiedStatus,
		&s.CreatedAt, &s.UpdatedAt, &s.StatusChangedAt, &s.Version, &s.Projects, &s.ProjectsFromSource}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	if pinnedAt != nil {
		s.HostKeyPinnedAt = *pinnedAt
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	if s.Projects == nil {
		s.Projects = []string{}
	}
	return nil
}

func scanServer(row pgx.Row) (*Server, error) {
	var s Server
	if err := ScanServer(row, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetServer reads the server with handle; ErrServerNotFound when there is none.
func GetServer(ctx context.Context, q Querier, handle string) (*Server, error) {
	s, err := scanServer(q.QueryRow(ctx, `SELECT `+ServerColumns+` FROM servers WHERE handle = $1`, handle))
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
	rows, err := q.Query(ctx, `SELECT `+ServerColumns+` FROM servers WHERE address = $1 ORDER BY handle`, canonical)
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
