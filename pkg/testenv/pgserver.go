package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a Postgres cluster owned by one test, started from
// Debian's binaries, for tests that stop and start Postgres underneath the
// code under test. Its database "postgres" is reached as user autoprov
// without a password (trust on loopback only). Run as root, the cluster
// belongs to the postgres user (Postgres refuses to run as root).
type PostgresServer struct {
	t    testing.TB
	Port int
	Dir  string // the cluster's data directory
	bin  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPostgresServer initialises a cluster in a fresh directory and starts
// it on a free loopback port; it is stopped and removed when the test ends.
func StartPostgresServer(t testing.TB) *PostgresServer {
	t.Helper()
	skipShort(t, "a Postgres server")
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("initdb not found (install Debian's postgresql, or run `make test`)")
	}
	s := &PostgresServer{t: t, Port: FreePort(t), bin: filepath.Dir(bins[len(bins)-1])}
	// A directory the postgres user can reach (a test's TempDir is not).
	base, err := os.MkdirTemp("/var/tmp", "autoprov-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	s.Dir = filepath.Join(base, "data")
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	initdb := s.command("initdb", "-D", s.Dir, "-U", "autoprov", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = "/"
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// URL is the server's connection string.
func (s *PostgresServer) URL() string {
	return fmt.Sprintf("postgres://autoprov@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
}

// Start starts the server (again) and waits until it accepts connections.
func (s *PostgresServer) Start() {
	s.t.Helper()
	s.cmd = s.command("postgres", "-D", s.Dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.Port), "-c", "unix_socket_directories=", "-c", "fsync=off",
		"-c", "max_connections=100")
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(s.Dir), "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatalf("start postgres: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(s.cmd, s.done)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			_ = c.Close(ctx)
			cancel()
			return
		}
		cancel()
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(s.Dir), "postgres.log"))
			s.t.Fatalf("postgres exited at start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("postgres on port %d did not come up: %v", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down (fast shutdown: sessions are terminated, as in
// a restart or a failover) and waits until it is gone.
func (s *PostgresServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}
