package cli

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// regexpIdle matches a consumer's row of status: its idle time, marked.
var regexpIdle = regexp.MustCompile(`gone-busy +1 +idle [0-9.]+m?s STALE`)

// TestStaleConsumers: status shows each consumer's idle time and marks the
// consumers of replicas that are gone as stale; consumers prune deletes a
// stale consumer only once it holds no pending entries, and names the
// pending count of one it keeps.
func TestStaleConsumers(t *testing.T) {
	// Not parallel: "live" must stay under the 1s idle threshold between its
	// read and status, which tests beside it (ansible-lint) can stretch.
	url, rdb := redisDB(t)
	env := map[string]string{"REDIS_URL": url}
	ctx := context.Background()
	q := messages.StreamProvisionerQueue
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: provisionRequest(t, "job-1", "web-1")}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreate(ctx, q, "infra", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: "gone-busy", Streams: []string{q, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err) // it takes the entry, then its process is gone
	}
	if err := rdb.XGroupCreateConsumer(ctx, q, "infra", "gone-idle").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	// A running replica reads (and, before Redis 7.2, whose idle times
	// count only reads that got entries, gets one).
	read := func(consumer string) {
		t.Helper()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: provisionRequest(t, "job-x", "web-x")}}).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: consumer, Streams: []string{q, ">"}, Count: 1, Block: -1}).Result()
		if err != nil || len(got) != 1 || len(got[0].Messages) != 1 {
			t.Fatal(got, err)
		}
		rdb.XAck(ctx, q, "infra", got[0].Messages[0].ID)
	}
	read("live")
	// alive runs fn while "live" keeps reading (a running replica does):
	// on a loaded machine the command alone can take past the 1 s
	// threshold, which would make "live" stale in the middle of a check.
	alive := func(fn func()) {
		t.Helper()
		read("live")
		payload := provisionRequest(t, "job-x", "web-x")
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond):
				}
				if rdb.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: payload}}).Err() != nil {
					continue
				}
				got, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: "live", Streams: []string{q, ">"}, Count: 1, Block: -1}).Result()
				if err == nil && len(got) == 1 && len(got[0].Messages) == 1 {
					rdb.XAck(ctx, q, "infra", got[0].Messages[0].ID)
				}
			}
		}()
		defer func() { close(stop); <-done }()
		fn()
	}

	consumers := func() map[string]consumerStatus {
		t.Helper()
		out, errOut, code := run(t, env, "--json", "status", "--stream", q, "--stale-after", "1s")
		if code != 0 {
			t.Fatalf("status: exit %d %s", code, errOut)
		}
		var report struct {
			Streams []streamStatus `json:"streams"`
		}
		mustJSON(t, out, &report)
		m := map[string]consumerStatus{}
		for _, c := range report.Streams[0].Groups[0].Consumers {
			m[c.Name] = c
		}
		return m
	}
	cs := consumers()
	for name, want := range map[string]bool{"gone-busy": true, "gone-idle": true, "live": false} {
		c, ok := cs[name]
		if !ok || c.Stale != want || (want && c.IdleSec < 1) {
			t.Errorf("consumer %s: %+v (present %v), want stale %v", name, c, ok, want)
		}
	}
	out, _, code := run(t, env, "status", "--stream", q, "--stale-after", "1s")
	if code != 0 || !strings.Contains(out, "3 (2 stale)") || strings.Count(out, "STALE") != 2 || !regexpIdle.MatchString(out) {
		t.Fatalf("status table (exit %d):\n%s", code, out)
	}

	// The default threshold is the lease: STREAM_LEASE or 30s, whichever
	// is longer.
	for lease, want := range map[string]float64{"": 30, "10s": 30, "45s": 45} {
		out, _, code := run(t, map[string]string{"REDIS_URL": url, "STREAM_LEASE": lease}, "--json", "status", "--stream", q)
		var report struct {
			StaleAfter float64 `json:"stale_after_seconds"`
		}
		mustJSON(t, out, &report)
		if code != 0 || report.StaleAfter != want {
			t.Errorf("STREAM_LEASE=%q: stale after %vs (exit %d), want %vs", lease, report.StaleAfter, code, want)
		}
	}

	names := func() []string {
		t.Helper()
		cs, err := rdb.XInfoConsumers(ctx, q, "infra").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		slices.Sort(n)
		return n
	}

	// --dry-run deletes nothing.
	alive(func() { out, _, code = run(t, env, "consumers", "prune", "--idle", "1s", "--dry-run") })
	if code != 1 || !strings.Contains(out, "would delete consumer gone-idle") || !slices.Equal(names(), []string{"gone-busy", "gone-idle", "live"}) {
		t.Fatalf("prune --dry-run (exit %d):\n%s\nconsumers %v", code, out, names())
	}

	// The idle one goes; the one holding an entry stays, named with its
	// count, and its entry stays pending.
	alive(func() { out, _, code = run(t, env, "consumers", "prune", "--idle", "1s") })
	if code != 1 || !strings.Contains(out, "deleted consumer gone-idle of provisioner:queue/infra") ||
		!strings.Contains(out, "kept consumer gone-busy of provisioner:queue/infra") || !strings.Contains(out, "1 pending entries") {
		t.Fatalf("prune (exit %d):\n%s", code, out)
	}
	if got := names(); !slices.Equal(got, []string{"gone-busy", "live"}) {
		t.Fatalf("consumers after prune: %v", got)
	}
	if p, _ := rdb.XPending(ctx, q, "infra").Result(); p == nil || p.Count != 1 {
		t.Fatalf("pending after prune: %+v", p)
	}

	// Once a live replica claimed its entry, it goes too.
	pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q, Group: "infra", Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(pend) != 1 {
		t.Fatalf("pending %v %v", pend, err)
	}
	if err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: q, Group: "infra", Consumer: "live", Messages: []string{pend[0].ID}}).Err(); err != nil {
		t.Fatal(err)
	}
	alive(func() { out, _, code = run(t, env, "--json", "consumers", "prune", "--idle", "1s") })
	if code != 0 || !strings.Contains(out, `"consumer": "gone-busy"`) {
		t.Fatalf("prune after the claim (exit %d):\n%s", code, out)
	}
	if got := names(); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("consumers after the second prune: %v", got)
	}
	if p, _ := rdb.XPending(ctx, q, "infra").Result(); p == nil || p.Count != 1 || p.Consumers["live"] != 1 {
		t.Fatalf("pending after the second prune: %+v", p)
	}
}
