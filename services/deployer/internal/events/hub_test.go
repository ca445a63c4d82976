package events_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

// startCluster starts a one-node Redis Cluster (redis-server with cluster
// mode on, owning every slot) on a free loopback port and returns a cluster
// client for it. One node is enough to show the rule that matters here:
// a command's keys must share one hash slot, whichever node holds them.
func startCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found (install Debian's redis-server, or run `make test`): %v", err)
	}
	dir := t.TempDir()
	port := strconv.Itoa(testenv.FreePort(t))
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Logf("redis-server log:\n%s", b)
		}
	})
	addr := net.JoinHostPort("127.0.0.1", port)
	node := redis.NewClient(&redis.Options{Addr: addr})
	defer node.Close()
	ctx := context.Background()
	testenv.WaitFor(t, 10*time.Second, "redis-server to answer", func() bool { return node.Ping(ctx).Err() == nil })
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the cluster to be ok", func() bool {
		info, _ := node.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHubOnRedisCluster follows two jobs whose event streams are in
// different hash slots of a Redis Cluster, where one XREAD over both is
// refused (CROSSSLOT): the hub still delivers every event of both, in order,
// including events published after the subscription.
func TestHubOnRedisCluster(t *testing.T) {
	t.Parallel()
	rdb := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	jobs := []string{testenv.Unique("job-a-"), testenv.Unique("job-b-")}
	slots := map[int64]bool{}
	for _, id := range jobs {
		slot, err := rdb.ClusterKeySlot(ctx, messages.ProgressStream(messages.JobKindDeploy, id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) != 2 {
		t.Fatalf("the two streams share a slot (%v): pick other ids", slots)
	}
	// The reason for the cluster path: one XREAD cannot read both.
	err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{messages.ProgressStream(messages.JobKindDeploy, jobs[0]),
		messages.ProgressStream(messages.JobKindDeploy, jobs[1]), "0", "0"}, Block: -1}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("XREAD over two slots: %v, want CROSSSLOT", err)
	}

	publish := func(id string, seq int64, typ messages.EventType) {
		t.Helper()
		ev := &messages.ProgressEvent{JobID: id, Seq: seq, Time: messages.FormatTime(time.Now()), Type: typ,
			Message: fmt.Sprint(seq)}
		if typ == messages.EventRunFinished {
			ev.Status = messages.StatusSucceeded
		}
		data, err := messages.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindDeploy, id),
			Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range jobs {
		publish(id, 1, messages.EventRunStarted) // history, read at Subscribe
	}

	hub := events.NewHub(stream.NewJobs(rdb), events.HubConfig{Poll: 20 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	subs := make([]*events.Subscription, len(jobs))
	for i, id := range jobs {
		s, err := hub.Subscribe(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs[i] = s
	}
	for _, id := range jobs { // live events
		publish(id, 2, messages.EventPlayStarted)
		publish(id, 3, messages.EventRunFinished)
	}
	for i, s := range subs {
		var got []string
		deadline := time.After(30 * time.Second)
		for len(got) < 3 {
			evs, more := s.Next()
			for _, ev := range evs {
				got = append(got, ev.Type)
			}
			if len(evs) > 0 {
				continue
			}
			select {
			case <-more:
			case <-deadline:
				t.Fatalf("job %s: events %v, want 3", jobs[i], got)
			}
		}
		want := []string{"run_started", "play_started", "run_finished"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("job %s: events %v, want %v", jobs[i], got, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
