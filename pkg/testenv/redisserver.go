package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server process owned by one test, for tests that
// restart or kill Redis underneath the code under test. It needs the
// redis-server binary (Debian's redis-server package, installed by
// `make test`).
type RedisServer struct {
	t     testing.TB
	Addr  string
	Dir   string
	Fsync string
	// Args are added to redis-server's command line (e.g. --aclfile).
	Args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartRedisServer starts redis-server with AOF persistence on a free
// loopback port; appendfsync is "always" so that even kill -9 keeps every
// acknowledged write. args are added to its command line (for example
// "--aclfile", path). It is stopped when the test ends.
func StartRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	skipShort(t, "a Redis server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found (install Debian's redis-server, or run `make test`): %v", err)
	}
	s := &RedisServer{
		t:     t,
		Addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))),
		Dir:   t.TempDir(),
		Fsync: "always",
		Args:  args,
	}
	s.Start()
	t.Cleanup(func() { s.Kill() })
	return s
}

// URL returns the redis:// URL of the server.
func (s *RedisServer) URL() string { return "redis://" + s.Addr + "/0" }

// Client returns a new client for the server, closed when the test ends.
func (s *RedisServer) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start starts the process (again) on the same port and data directory and
// waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	logf, err := os.OpenFile(filepath.Join(s.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command("redis-server", append([]string{
		"--bind", "127.0.0.1", "--port", port, "--dir", s.Dir,
		"--appendonly", "yes", "--appendfsync", s.Fsync, "--save", "",
		"--daemonize", "no"}, s.Args...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(s.cmd, s.done)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			return // it answers (maybe "NOAUTH": its ACL wants a user)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not come up: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down gracefully (SIGTERM: AOF flushed) and waits.
func (s *RedisServer) Stop() { s.signal(syscall.SIGTERM) }

// Kill kills the server with SIGKILL and waits.
func (s *RedisServer) Kill() { s.signal(syscall.SIGKILL) }

// Restart stops the server gracefully, waits for down, then starts it again.
func (s *RedisServer) Restart(down time.Duration) {
	s.Stop()
	time.Sleep(down)
	s.Start()
}

func (s *RedisServer) signal(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		s.t.Errorf("redis-server did not stop on %v", sig)
	}
}

// String describes the server for logs.
func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s (%s)", s.Addr, s.Dir) }
