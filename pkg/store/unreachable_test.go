package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// unreachableCase is an error pgx returned (or, for codes no test server
// can be made to send, one built like it) and whether Unreachable must
// take it for an outage.
type unreachableCase struct {
	name string
	err  error
	want bool
}

// TestUnreachable classifies what pgx v5 returns when Postgres is down,
// cut off, silent, shutting down or stopped mid-statement (outages), when
// the caller cancels (never one, even while Postgres is away), and when
// Postgres answers or the code errs (never one either).
func TestUnreachable(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	var cases []unreachableCase
	add := func(name string, err error, want bool) {
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		cases = append(cases, unreachableCase{name, err, want})
	}

	// Nothing listens on the port.
	closed := fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable&connect_timeout=5", testenv.FreePort(t))
	_, err := pgx.Connect(bg, closed)
	add("connect: connection refused", err, true)
	down := newPool(t, closed)
	_, err = down.Exec(bg, "select 1")
	add("pool: connection refused", err, true)
	add("pool, Postgres down, request cancelled", execCancelled(down), false)

	// A server that accepts connections and never answers (a hung host, a
	// network partition that drops packets).
	silent := silentServer(t)
	_, err = pgx.Connect(bg, silent+"&connect_timeout=1")
	add("connect: connect_timeout", err, true)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	_, err = pgx.Connect(ctx, silent)
	cancel()
	add("connect: context deadline", err, true)
	hung := newPool(t, silent)
	ctx, cancel = context.WithTimeout(bg, 300*time.Millisecond)
	_, err = hung.Exec(ctx, "select 1")
	cancel()
	add("pool acquire: context deadline", err, true)
	ctx, cancel = context.WithCancel(bg)
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = pgx.Connect(ctx, silent)
	add("connect cancelled while waiting", err, false)
	ctx, cancel = context.WithCancel(bg)
	cancel()
	_, err = pgx.Connect(ctx, silent)
	add("connect cancelled before dialling", err, false)
	add("pool acquire cancelled while waiting", execCancelledAfter(hung, 200*time.Millisecond), false)

	// The shared server, live.
	dsn := testenv.Postgres(t)
	live := newPool(t, dsn)
	ctx, cancel = context.WithTimeout(bg, 200*time.Millisecond)
	_, err = live.Exec(ctx, "select pg_sleep(5)")
	cancel()
	add("statement past its deadline", err, true)
	add("statement cancelled mid-flight", execCancelledAfter(live, 200*time.Millisecond, "select pg_sleep(5)"), false)
	add("pool, request cancelled", execCancelled(live), false)
	ctx, cancel = context.WithCancel(bg)
	tx, err := live.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	_, err = tx.Exec(ctx, "select 1") // "timeout: context already done: context canceled"
	add("transaction, request cancelled", err, false)
	add("commit, request cancelled", tx.Commit(ctx), false)
	conn := connect(t, dsn)
	_, err = conn.Exec(bg, "select 1/0")
	add("an answer: division by zero", err, false)
	_, err = conn.Exec(bg, "select $1::int", make(chan int))
	add("a bug: argument cannot be encoded", err, false)
	rows, err := conn.Query(bg, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(bg, "select 1")
	rows.Close()
	add("a bug: conn busy", err, false)
	var pid int
	if err := conn.QueryRow(bg, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Exec(bg, "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(bg, "select 1")
	add("session terminated (57P01)", err, true)
	_, err = conn.Exec(bg, "select 1")
	add("connection closed by the termination", err, true)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pgx.Connect(bg, strings.Replace(dsn, u.Path, "/no_such_database", 1))
	add("an answer: no such database", err, false)
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	_, err = pgx.Connect(bg, u.String())
	add("an answer: wrong password", err, false)
	closedPool := newPool(t, dsn)
	closedPool.Close()
	_, err = closedPool.Exec(bg, "select 1")
	add("our pool closed (a shutdown)", err, false)

	// The network between cut: live connections reset, new ones refused.
	proxy := testenv.StartProxy(t, u.Host)
	cut := newPool(t, proxy.URL(t, dsn))
	time.AfterFunc(300*time.Millisecond, proxy.Cut)
	_, err = cut.Exec(bg, "select pg_sleep(5)")
	add("cut mid-statement", err, true)
	_, err = cut.Exec(bg, "select 1")
	add("cut: new connection reset", err, true)

	// A server of the test's own, shut down under its sessions.
	pg := testenv.StartPostgresServer(t)
	held := connect(t, pg.URL())
	smartShutdown(t, pg)
	testenv.WaitFor(t, 10*time.Second, "the smart shutdown to refuse connections", func() bool {
		c, err := pgx.Connect(bg, pg.URL())
		if err == nil {
			_ = c.Close(bg)
			return false
		}
		add("connect while shutting down (57P03)", err, true)
		return true
	})
	time.AfterFunc(300*time.Millisecond, pg.Stop) // fast shutdown: sessions terminated
	_, err = held.Exec(bg, "select pg_sleep(5)")
	add("server stopped mid-statement (57P01)", err, true)
	_, err = pgx.Connect(bg, pg.URL()+"&connect_timeout=5")
	add("server stopped: connection refused", err, true)

	// Codes no test server can be made to send at will.
	for _, c := range []struct {
		code string
		want bool
	}{{"08006", true}, {"08001", true}, {"57P02", true}, {"53300", true}, {"40001", false}, {"23505", false}} {
		add("SQLSTATE "+c.code, fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "FATAL", Code: c.code}), c.want)
	}
	add("context.DeadlineExceeded", fmt.Errorf("wrapped: %w", context.DeadlineExceeded), true)
	add("context.Canceled", fmt.Errorf("wrapped: %w", context.Canceled), false)
	add("some other error", errors.New("boom"), false)

	if store.Unreachable(nil) {
		t.Error("Unreachable(nil) = true")
	}
	for _, c := range cases {
		if got := store.Unreachable(c.err); got != c.want {
			t.Errorf("%s: Unreachable = %v, want %v (%T: %v)", c.name, got, c.want, c.err, c.err)
		}
	}
}

// newPool opens a pool on dsn without waiting for a connection (unlike
// store.Open, which fails when Postgres is away), closed when the test ends.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// connect opens one connection to dsn, closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// execCancelled runs a statement on p with a context cancelled before.
func execCancelled(p *pgxpool.Pool) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Exec(ctx, "select 1")
	return err
}

// execCancelledAfter runs sql (select 1 by default) on p and cancels its
// context after d.
func execCancelledAfter(p *pgxpool.Pool, d time.Duration, sql ...string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(d, cancel)
	q := "select 1"
	if len(sql) > 0 {
		q = sql[0]
	}
	_, err := p.Exec(ctx, q)
	return err
}

// silentServer listens on a loopback port, accepts connections and never
// answers on them, until the test ends; it returns a URL for it.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable"
}

// smartShutdown asks pg's postmaster for a smart shutdown (SIGTERM): it
// refuses new connections (SQLSTATE 57P03) and waits for its sessions.
func smartShutdown(t *testing.T, pg *testenv.PostgresServer) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(pg.Dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}
