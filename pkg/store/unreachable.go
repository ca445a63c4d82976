package store

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says Postgres cannot be reached right now
// (a restart, a failover, a network cut, too many connections, a server
// that does not answer in time), as opposed to an answer it gave: worth
// waiting out or answering "try again later", never a caller's fault nor a
// bug.
//
// A cancelled context is never an outage: it is the caller giving up (an
// HTTP client gone, a shutdown), even while Postgres is away, so that it
// does not turn into answers or waits meant for one. A deadline that
// passed is one: Postgres did not answer in time (a per-try timeout, a
// pool that cannot connect). Errors pgx reports as safe to retry are not
// taken as such for that alone: they include its "conn busy" and argument
// encoding errors, which are bugs.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
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
	case errors.As(err, &connectErr), // no connection made, the server refused none (a PgError)
		pgconn.Timeout(err), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr),
		errors.Is(err, pgconn.ErrConnClosed), // the connection broke under an earlier statement
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}
