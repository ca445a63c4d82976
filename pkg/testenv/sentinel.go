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
	for range 3 {
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
		logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sentinelBin, conf)
		if sentinelBin == "redis-server" {
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
		s.sentinels = append(s.sentinels, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	for _, addr := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		s.waitFor(time.Minute, "sentinel "+addr+" to know the replica and the other sentinels", func() bool {
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

func (s *SentinelSet) waitFor(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
