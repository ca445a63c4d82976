package store

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says Postgres cannot be reached right now
// (a restart, a failover, a network cut, too many connections), as opposed
// to an answer it gave: worth waiting out or answering "try again later",
// never a caller's fault nor a bug.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch c := pgErr.Code; {
		case strings.HasPrefix(c, "08"), // connection exception
			c == "57P01", c == "57P02", c == "57P03", // admin/crash shutdown, cannot connect now
			c == "53300": // too many connections
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		pgconn.SafeToRetry(err):
		return true
	}
	return strings.Contains(err.Error(), "conn closed")
}
