package deploy

import (
	"context"
	"fmt"
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
)

// startCluster starts a 3-primary Redis Cluster from Debian's redis-server
// on loopback and returns its nodes' addresses; the nodes are stopped (by
// their pids) when the test ends.
func startCluster(t *testing.T) []string {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: install Debian's redis-server (scripts/services.sh deps does)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: install Debian's redis-tools")
	}
	dir := t.TempDir()
	var addrs []string
	for i := range 3 {
		port := testenv.FreePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(server, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", i)),
			"--dir", dir, "--save", "", "--appendonly", "no", "--protected-mode", "yes")
		cmd.Stdout, cmd.Stderr = nil, nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		addrs = append(addrs, addr)
	}
	waitNodes(t, addrs, "answer PING", func(rdb *redis.Client) bool {
		return rdb.Ping(context.Background()).Err() == nil
	})
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	waitNodes(t, addrs, "report cluster_state:ok", func(rdb *redis.Client) bool {
		info, err := rdb.ClusterInfo(context.Background()).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	return addrs
}

// waitNodes waits (up to 10 s) until ready holds for every node.
func waitNodes(t *testing.T, addrs []string, what string, ready func(*redis.Client) bool) {
	t.Helper()
	for _, a := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a})
		ok := false
		for range 200 {
			if ok = ready(rdb); ok {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		rdb.Close()
		if !ok {
			t.Fatalf("redis node %s did not %s", a, what)
		}
	}
}

// TestInfraOnRedisCluster runs the real infra binary on a 3-primary Redis
// Cluster: a request in (for a server that is not registered: rejected
// without SSH) and its result out, a bad message dead-lettered with a
// rejected result, the queue acknowledged.
func TestInfraOnRedisCluster(t *testing.T) {
	addrs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()

	admin := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	runRoot := testenv.RunRoot(t)
	ansibleDir, _ := filepath.Abs(filepath.Join(root, "ansible"))
	infra := testenv.StartBinary(t, filepath.Join(binDir, "infra"), testenv.BinaryEnv(
		"REDIS_URL=redis://"+addrs[0]+"/0",
		"REDIS_CLUSTER_ADDRS="+strings.Join(addrs, ","),
		"DATABASE_URL="+testenv.EmptyDatabase(t),
		"ADMIN_ADDR="+admin,
		"LOG_FORMAT=json",
		"PLAYBOOK_DIR="+ansibleDir,
		"PLAYBOOK_RUN_ROOT="+runRoot,
	))
	infra.WaitHTTP("http://"+admin+"/readyz", 200, 60*time.Second)

	req := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: "cluster-job-1"}, ServerHandle: "ghost-1"}
	data, err := messages.Encode(req)
	if err != nil {
		t.Fatal(err)
	}
	pub := stream.NewProducer(rdb, stream.ProducerOptions{})
	if _, err := pub.Publish(ctx, messages.StreamProvisionerQueue, data); err != nil {
		t.Fatalf("publish on the cluster: %v", err)
	}
	badID, err := pub.Publish(ctx, messages.StreamProvisionerQueue, []byte("\xc1 not msgpack"))
	if err != nil {
		t.Fatal(err)
	}

	var results []*messages.ProvisionerResult
	var dead []redis.XMessage
	for ctx.Err() == nil {
		msgs, err := rdb.XRange(ctx, messages.StreamProvisionerResults, "-", "+").Result()
		if err != nil {
			t.Fatalf("xrange results: %v", err)
		}
		results = results[:0]
		for _, m := range msgs {
			r, err := messages.DecodeProvisionerResult((&stream.Message{Values: m.Values}).Data())
			if err != nil {
				t.Fatalf("a result that does not decode: %v", err)
			}
			results = append(results, r)
		}
		if dead, err = rdb.XRange(ctx, messages.StreamProvisionerQueue+stream.DeadLetterSuffix, "-", "+").Result(); err != nil {
			t.Fatalf("xrange dead letters: %v", err)
		}
		if len(results) >= 2 && len(dead) >= 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("on the cluster: %d results %+v, %d dead letters; infra's log:\n%s", len(results), results, len(dead), tail(infra.Stderr(), 4000))
	}
	var ours, bad *messages.ProvisionerResult
	for _, r := range results {
		switch r.JobID {
		case "cluster-job-1":
			ours = r
		case badID:
			bad = r
		}
	}
	if ours == nil || ours.Status == messages.StatusSucceeded || ours.ServerHandle != "ghost-1" {
		t.Fatalf("result of the request for an unregistered server: %+v (all: %+v)", ours, results)
	}
	if bad == nil || bad.Status != messages.StatusRejected {
		t.Fatalf("result of the bad message: %+v (all: %+v)", bad, results)
	}
	t.Logf("on the cluster: request %s -> %s (%v); bad message %s -> %s, dead-lettered", ours.JobID, ours.Status, ours.Error, badID, bad.Status)
	if len(dead) != 1 || dead[0].Values[stream.DeadFieldID] != badID {
		t.Fatalf("dead letters %+v, want the bad message %s", dead, badID)
	}
	// Everything acknowledged: nothing pending in infra's group.
	for range 100 {
		p, err := rdb.XPending(ctx, messages.StreamProvisionerQueue, "infra").Result()
		if err == nil && p.Count == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("entries still pending in the infra group on the cluster")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
