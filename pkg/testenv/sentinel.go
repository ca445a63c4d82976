package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelSet is a Redis primary, one replica and three Sentinels owned by
// one test, all on loopback, for tests that fail the primary over
// underneath the code under test. The Sentinels are Debian's redis-sentinel
// (installed by `make test`), or `redis-server <conf> --sentinel` where it
// is missing.
type SentinelSet struct {
	t testing.TB
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Servers are the two data servers; either may be the primary.
	Servers   []*RedisServer
	sentinels []string // host:port
}

// StartSentinelSet starts the primary, a replica of it and three Sentinels
// (quorum 2, down after 1 s) and waits until the Sentinels know the replica
// and each other. Everything is stopped when the test ends.
func StartSentinelSet(t testing.TB) *SentinelSet {
	t.Helper()
	// Debian's redis-sentinel (make test installs it) is redis-server in
	// Sentinel mode; without it, redis-server --sentinel is the same.
	sentinelBin := "redis-sentinel"
	if _, err := exec.LookPath(sentinelBin); err != nil {
		sentinelBin = "redis-server"
	}
	s := &SentinelSet{t: t, Master: "autoprov-test"}
	primary := StartRedisServer(t)
	_, pport, _ := net.SplitHostPort(primary.Addr)
	replica := StartRedisServer(t, "--replicaof", "127.0.0.1", pport)
	s.Servers = []*RedisServer{primary, replica}
	ctx := context.Background()
	rc := replica.Client()
	s.waitFor(30*time.Second, "the replica to sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	var logs []string
	for range 3 {
		addr, log := s.startSentinel(sentinelBin, pport)
		s.sentinels, logs = append(s.sentinels, addr), append(logs, log)
	}
	for i, addr := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		s.waitForOr(time.Minute, "sentinel "+addr+" to know the replica and the other sentinels", func() string {
			return sentinelLogs(logs, i)
		}, func() bool {
			replicas, err := sc.Replicas(ctx, s.Master).Result()
			if err != nil || len(replicas) != 1 {
				return false
			}
			others, err := sc.Sentinels(ctx, s.Master).Result()
			return err == nil && len(others) == 2
		})
		_ = sc.Close()
	}
	return s
}

// Addrs returns the Sentinels' host:port addresses.
func (s *SentinelSet) Addrs() []string { return append([]string(nil), s.sentinels...) }

// Client returns a client that follows the primary through the Sentinels,
// closed when the test ends.
func (s *SentinelSet) Client() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Primary returns the address of the current primary, as the Sentinels see it.
func (s *SentinelSet) Primary() string {
	s.t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(context.Background(), s.Master).Result()
	if err != nil {
		s.t.Fatalf("sentinel get-master-addr-by-name: %v", err)
	}
	return net.JoinHostPort(addr[0], addr[1])
}

// Failover makes the Sentinels promote the replica (SENTINEL FAILOVER) and
// waits until they name it the primary and it accepts writes.
func (s *SentinelSet) Failover() {
	s.t.Helper()
	ctx := context.Background()
	old := s.Primary()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer sc.Close()
	if err := sc.Failover(ctx, s.Master).Err(); err != nil {
		s.t.Fatalf("sentinel failover: %v", err)
	}
	s.waitFor(time.Minute, "the failover to promote the replica", func() bool {
		now := s.Primary()
		if now == old {
			return false
		}
		c := redis.NewClient(&redis.Options{Addr: now})
		defer c.Close()
		role, err := c.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
}

// startSentinel starts one Sentinel monitoring the primary on pport and
// waits until it answers; it returns its address and its log's path. A
// port taken between FreePort and the Sentinel's bind (another test's
// server got it first) makes the Sentinel exit at once: it is started
// again on another port.
func (s *SentinelSet) startSentinel(bin, pport string) (addr, logPath string) {
	t := s.t
	t.Helper()
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel monitor %s 127.0.0.1 %s 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, port, dir, s.Master, pport, s.Master, s.Master, s.Master)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		logPath = filepath.Join(dir, "sentinel.log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf)
		if bin == "redis-server" {
			cmd.Args = append(cmd.Args, "--sentinel")
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis sentinel: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
		})
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if s.sentinelAnswers(addr, done) {
			return addr, logPath
		}
		if attempt == 5 {
			t.Fatalf("redis sentinel on %s did not start (attempt %d):\n%s", addr, attempt, tail(logPath))
		}
		t.Logf("redis sentinel on %s did not start, trying another port:\n%s", addr, tail(logPath))
	}
}

// sentinelAnswers waits up to 10 s for the Sentinel on addr to answer
// SENTINEL MASTERS with the monitored primary; false if its process
// exited first (done closed) or it never answered.
func (s *SentinelSet) sentinelAnswers(addr string, done <-chan struct{}) bool {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := sc.Master(ctx, s.Master).Result()
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// sentinelLogs is the tail of every Sentinel's log, the i-th first.
func sentinelLogs(paths []string, i int) string {
	var b strings.Builder
	for j := range paths {
		k := (i + j) % len(paths)
		fmt.Fprintf(&b, "--- %s\n%s\n", paths[k], tail(paths[k]))
	}
	return b.String()
}

// tail is the last 2 KiB of the file at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}

func (s *SentinelSet) waitFor(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	s.waitForOr(timeout, what, nil, cond)
}

// waitForOr is waitFor whose failure adds detail()'s text.
func (s *SentinelSet) waitForOr(timeout time.Duration, what string, detail func() string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			if detail != nil {
				msg = "\n" + detail()
			}
			s.t.Fatalf("timed out after %s waiting for %s%s", timeout, what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
