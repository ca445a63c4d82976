package service_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestRedisOptions(t *testing.T) {
	tests := []struct {
		name       string
		cfg        service.RedisConfig
		wantAddrs  []string
		wantMaster string
		wantSentPW string
		wantDB     int
		wantUser   string
		wantPW     string
		wantTLS    bool
		cluster    bool
		wantClient string // the client NewUniversalClient builds
	}{
		{
			name:       "single",
			cfg:        service.RedisConfig{URL: "redis://user:pw@10.0.0.1:6380/3?dial_timeout=3s"},
			wantAddrs:  []string{"10.0.0.1:6380"},
			wantDB:     3,
			wantUser:   "user",
			wantPW:     "pw",
			wantClient: "*redis.Client",
		},
		{
			name:       "single over TLS",
			cfg:        service.RedisConfig{URL: "rediss://:pw@redis.example.com:6380/0"},
			wantAddrs:  []string{"redis.example.com:6380"},
			wantPW:     "pw",
			wantTLS:    true,
			wantClient: "*redis.Client",
		},
		{
			name: "sentinel",
			cfg: service.RedisConfig{
				URL:              "redis://:masterpw@ignored:1/2",
				SentinelMaster:   "mymaster",
				SentinelAddrs:    []string{"10.0.0.1:26379", "10.0.0.2:26379"},
				SentinelPassword: "sentinelpw",
			},
			wantAddrs:  []string{"10.0.0.1:26379", "10.0.0.2:26379"},
			wantMaster: "mymaster",
			wantSentPW: "sentinelpw",
			wantDB:     2,
			wantPW:     "masterpw",
			wantClient: "*redis.Client", // go-redis's failover client is a *redis.Client
		},
		{
			name:       "cluster with one seed",
			cfg:        service.RedisConfig{URL: "redis://:pw@ignored:1/0", ClusterAddrs: []string{"10.0.0.1:7000"}},
			wantAddrs:  []string{"10.0.0.1:7000"},
			wantPW:     "pw",
			cluster:    true,
			wantClient: "*redis.ClusterClient",
		},
		{
			name:       "cluster",
			cfg:        service.RedisConfig{URL: "redis://127.0.0.1:1", ClusterAddrs: []string{"10.0.0.1:7000", "10.0.0.2:7000"}},
			wantAddrs:  []string{"10.0.0.1:7000", "10.0.0.2:7000"},
			cluster:    true,
			wantClient: "*redis.ClusterClient",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.cfg.Options()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantAddrs, o.Addrs); diff != "" {
				t.Errorf("Addrs (-want, +got):\n%s", diff)
			}
			if o.MasterName != tt.wantMaster || o.SentinelPassword != tt.wantSentPW || o.DB != tt.wantDB ||
				o.Username != tt.wantUser || o.Password != tt.wantPW || (o.TLSConfig != nil) != tt.wantTLS ||
				o.IsClusterMode != tt.cluster {
				t.Errorf("options: %+v", o)
			}
			c := redis.NewUniversalClient(o)
			defer c.Close()
			if got := fmt.Sprintf("%T", c); got != tt.wantClient {
				t.Errorf("client %s, want %s", got, tt.wantClient)
			}
		})
	}
}

func TestRedisOptionsInvalid(t *testing.T) {
	tests := []struct {
		name string
		cfg  service.RedisConfig
		want string // the variable blamed
	}{
		{"bad scheme", service.RedisConfig{URL: "http://x"}, "REDIS_URL"},
		{"bad db", service.RedisConfig{URL: "redis://:hunter2@x/abc"}, "REDIS_URL"},
		{"not a URL", service.RedisConfig{URL: "redis://:hunter2@x:bad port/0"}, "REDIS_URL"},
		{"master without sentinels", service.RedisConfig{URL: service.DefaultRedisURL, SentinelMaster: "m"}, "REDIS_SENTINEL_ADDRS"},
		{"sentinels without master", service.RedisConfig{URL: service.DefaultRedisURL, SentinelAddrs: []string{"a:1"}}, "REDIS_SENTINEL_MASTER"},
		{"sentinel and cluster", service.RedisConfig{URL: service.DefaultRedisURL, SentinelMaster: "m", SentinelAddrs: []string{"a:1"}, ClusterAddrs: []string{"b:1"}}, "REDIS_CLUSTER_ADDRS"},
		{"cluster with a db", service.RedisConfig{URL: "redis://x:1/3", ClusterAddrs: []string{"b:1"}}, "REDIS_URL"},
		{"sentinel address without port", service.RedisConfig{URL: service.DefaultRedisURL, SentinelMaster: "m", SentinelAddrs: []string{"a"}}, "REDIS_SENTINEL_ADDRS"},
		{"sentinel password alone", service.RedisConfig{URL: service.DefaultRedisURL, SentinelPassword: "x"}, "REDIS_SENTINEL_PASSWORD"},
		{"unix socket with cluster", service.RedisConfig{URL: "unix:///run/redis.sock", ClusterAddrs: []string{"b:1"}}, "REDIS_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.Options()
			var fe *service.FieldError
			if !errors.As(err, &fe) || fe.Var != tt.want {
				t.Fatalf("Options() = %v, want a problem with %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

func TestNewRedis(t *testing.T) {
	ctx := context.Background()
	c, err := service.NewRedis(ctx, service.RedisConfig{URL: testenv.RedisURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := testenv.Unique("service_test_")
	if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("GET %s = %q, %v", key, got, err)
	}
}

func TestNewRedisUnreachable(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens there
	_, err := service.NewRedis(context.Background(), service.RedisConfig{URL: "redis://" + addr + "/0?max_retries=-1"})
	if err == nil || !strings.Contains(err.Error(), "ping redis") {
		t.Errorf("NewRedis on a closed port = %v, want a ping error", err)
	}
}

// TestNewRedisUnixSocket runs a redis-server of its own on a unix socket.
func TestNewRedisUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command("redis-server", "--port", "0", "--unixsocket", sock, "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server (Debian's redis-server package): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	for !strings.Contains(lines.Text(), "ready to accept connections") {
		if !lines.Scan() {
			t.Fatalf("redis-server ended before it was ready: %v", lines.Err())
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()

	c, err := service.NewRedis(context.Background(), service.RedisConfig{URL: "unix://" + sock + "?db=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.ClientInfo(context.Background()).Result(); err != nil || got.DB != 1 {
		t.Errorf("CLIENT INFO over the socket: %+v, %v", got, err)
	}
}
