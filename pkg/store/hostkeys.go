package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PinHostKey pins key (authorized_keys format) as the SSH host key of the
// unregistered deploy target address:port if none is pinned yet (trust on
// first use) and returns the key pinned now (the address is kept in its
// canonical form, see CanonicalAddress): key itself, or the one pinned
// before (maybe a moment ago by another instance). A caller whose key
// differs from the returned one must not trust the host. Registered
// servers pin theirs with PinServerHostKey.
func PinHostKey(ctx context.Context, q Querier, address string, port int, key string) (pinned string, err error) {
	address, err = CanonicalAddress(address)
	if err != nil {
		return "", fmt.Errorf("pin host key: %w", err)
	}
	target := net.JoinHostPort(address, strconv.Itoa(port))
	key = strings.TrimSpace(key)
	if key == "" {
		return "", fmt.Errorf("pin host key of %s: empty key", target)
	}
	// ON CONFLICT DO NOTHING waits for a concurrent insert of the same key
	// to commit, then inserts nothing; the SELECT (a new statement, so a
	// new snapshot) sees the winner's key.
	err = q.QueryRow(ctx, `INSERT INTO host_keys (address, ssh_port, host_key) VALUES ($1, $2, $3)
		ON CONFLICT (address, ssh_port) DO NOTHING RETURNING host_key`, address, port, key).Scan(&pinned)
	if err == nil {
		return pinned, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("pin host key of %s: %w", target, err)
	}
	pinned, err = GetHostKey(ctx, q, address, port)
	if err != nil {
		return "", err
	}
	if pinned == "" { // removed again in between; should not happen in practice
		return "", fmt.Errorf("pin host key of %s: key removed concurrently", target)
	}
	return pinned, nil
}

// GetHostKey returns the host key pinned for the unregistered deploy
// target address:port, or "" when none is pinned. Every spelling of an
// address finds the same pin (CanonicalAddress).
func GetHostKey(ctx context.Context, q Querier, address string, port int) (string, error) {
	address, err := CanonicalAddress(address)
	if err != nil {
		return "", fmt.Errorf("read host key: %w", err)
	}
	var key string
	err = q.QueryRow(ctx, `SELECT host_key FROM host_keys WHERE address = $1 AND ssh_port = $2`, address, port).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read host key of %s: %w", net.JoinHostPort(address, strconv.Itoa(port)), err)
	}
	return key, nil
}

// ClearHostKey forgets the host key pinned for address:port (after the host
// was reinstalled); removed says whether one was pinned.
func ClearHostKey(ctx context.Context, q Querier, address string, port int) (removed bool, err error) {
	address, err = CanonicalAddress(address)
	if err != nil {
		return false, fmt.Errorf("clear host key: %w", err)
	}
	tag, err := q.Exec(ctx, `DELETE FROM host_keys WHERE address = $1 AND ssh_port = $2`, address, port)
	if err != nil {
		return false, fmt.Errorf("clear host key of %s: %w", net.JoinHostPort(address, strconv.Itoa(port)), err)
	}
	return tag.RowsAffected() > 0, nil
}
