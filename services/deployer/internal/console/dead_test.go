package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestDeadLetters replays and drops dead letters as `autoprov dead` does:
// once, with the operator recorded; never one refused for its signature;
// only with the admin scope.
func TestDeadLetters(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testenv.RedisDB(t)) // the system's stream names, in a database of the test's own
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	e := deployertest.Start(t, deployertest.Options{NoInfra: true, Redis: rdb})
	dead := messages.StreamProvisionerQueue + stream.DeadLetterSuffix
	add := func(reason string) string {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dead, Values: map[string]any{
			messages.DataField: "payload", stream.DeadFieldReason: reason, stream.DeadFieldError: "it failed",
			stream.DeadFieldStream: messages.StreamProvisionerQueue, stream.DeadFieldID: "1-1",
			stream.DeadFieldAt: time.Now().UTC().Format(time.RFC3339Nano)}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	plain, forged := add("handler_error"), add(messages.ReasonBadSignature)

	admin := newBrowser(t, e.URL)
	csrf := admin.signIn(e.Admin)
	post := func(b *browser, csrf, action, id string) (*http.Response, string) {
		return b.post("/ui/queues/dead/"+action, url.Values{"csrf": {csrf}, "stream": {messages.StreamProvisionerQueue}, "id": {id}})
	}

	// A servers:read key sees the dead letters but cannot act on them.
	ops := newBrowser(t, e.URL)
	opsCSRF := ops.signIn(e.Key("ops", []auth.Scope{auth.ScopeServersRead}))
	if res, page := ops.get("/ui/queues"); res.StatusCode != http.StatusOK || !strings.Contains(page, plain) || strings.Contains(page, `aria-label="Replay dead letter`) {
		t.Fatalf("queues for servers:read: %d\n%s", res.StatusCode, page)
	}
	if res, _ := post(ops, opsCSRF, "replay", plain); res.StatusCode != http.StatusForbidden {
		t.Fatalf("replay without admin: %d", res.StatusCode)
	}

	// Replay is offered for the plain one, not the one refused for its
	// signature (only autoprov dead replay --resign puts it back).
	_, page := admin.get("/ui/queues")
	if !strings.Contains(page, `aria-label="Replay dead letter `+plain) || strings.Contains(page, `aria-label="Replay dead letter `+forged) ||
		!strings.Contains(page, "--resign") {
		t.Fatalf("replay buttons:\n%s", page)
	}
	res, _ := post(admin, csrf, "replay", plain)
	if res.StatusCode != http.StatusSeeOther || !strings.Contains(res.Header.Get("Location"), "replayed") {
		t.Fatalf("replay: %d %s", res.StatusCode, res.Header.Get("Location"))
	}
	entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil || len(entries) != 1 || entries[0].Values[messages.DataField] != "payload" ||
		entries[0].Values[stream.ReplayFieldBy] != "console:admin" || entries[0].Values[stream.ReplayFieldDeadID] != plain {
		t.Fatalf("replayed entry: %+v %v", entries, err)
	}
	if res, _ := post(admin, csrf, "replay", plain); res.StatusCode != http.StatusConflict {
		t.Fatalf("a second replay: %d, want 409", res.StatusCode)
	}
	if res, page := post(admin, csrf, "replay", forged); res.StatusCode != http.StatusConflict || !strings.Contains(page, "--resign") {
		t.Fatalf("replay of a forged request: %d\n%s", res.StatusCode, page)
	}
	if n, _ := rdb.XLen(ctx, messages.StreamProvisionerQueue).Result(); n != 1 {
		t.Fatalf("the stream holds %d entries, want 1", n)
	}

	// Dropping asks first.
	if res, page := post(admin, csrf, "drop", forged); res.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-drop"`) {
		t.Fatalf("drop without confirmation: %d\n%s", res.StatusCode, page)
	}
	if n, _ := rdb.XLen(ctx, dead).Result(); n != 2 {
		t.Fatalf("%d dead letters after an unconfirmed drop, want 2", n)
	}
	if res, _ := admin.post("/ui/queues/dead/drop", url.Values{"csrf": {csrf}, "stream": {messages.StreamProvisionerQueue},
		"id": {forged}, "confirm": {"yes"}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("drop: %d", res.StatusCode)
	}
	if left, _ := rdb.XRange(ctx, dead, "-", "+").Result(); len(left) != 1 || left[0].ID != plain {
		t.Fatalf("dead letters after the drop: %+v", left)
	}
	if res, _ := post(admin, csrf, "replay", "1-1"); res.StatusCode != http.StatusNotFound {
		t.Fatalf("replay of no dead letter: %d", res.StatusCode)
	}

	// Pages of 50: the 60th of them is on the second page.
	var ids []string
	for range 59 {
		ids = append(ids, add("handler_error"))
	}
	_, page = admin.get("/ui/queues")
	next := regexp.MustCompile(`href="(/ui/queues\?after=[^"]+)"`).FindStringSubmatch(page)
	if next == nil || strings.Contains(page, ids[58]) || !strings.Contains(page, ids[48]) {
		t.Fatalf("first page of dead letters:\n%s", page)
	}
	_, page = admin.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	if !strings.Contains(page, ids[58]) || strings.Contains(page, ids[48]) {
		t.Fatalf("second page of dead letters:\n%s", page)
	}
}

// TestQueuesDiscoverPoolsAndDeadLetters: the queues page lists the job
// queue, a job pool's queue nobody configured and any stream with dead
// letters, found in Redis, with their dead letters.
func TestQueuesDiscoverPoolsAndDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	pool := e.Streams.JobQueue + ":gpu"
	other := testenv.Unique("other-queue-")
	for _, s := range []string{pool, other} {
		if err := e.Redis.XGroupCreateMkStream(ctx, s, "infra", "$").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Redis.Del(context.Background(), s, s+stream.DeadLetterSuffix) })
	}
	deadID, err := e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: other + stream.DeadLetterSuffix, Values: map[string]any{
		messages.DataField: "payload", stream.DeadFieldReason: "handler_error", stream.DeadFieldError: "it failed",
		stream.DeadFieldStream: other, stream.DeadFieldID: "1-1", stream.DeadFieldAt: time.Now().UTC().Format(time.RFC3339Nano)}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	ops := newBrowser(t, e.URL)
	ops.signIn(e.Key("ops", []auth.Scope{auth.ScopeServersRead}))
	res, page := ops.get("/ui/queues")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("queues: %d", res.StatusCode)
	}
	for _, want := range []string{e.Streams.JobQueue, e.Streams.JobResults, pool, other, deadID} {
		if !strings.Contains(page, want) {
			t.Errorf("the queues page lacks %s", want)
		}
	}
	if strings.Contains(page, pool+stream.DeadLetterSuffix+"<") {
		t.Error("a dead-letter stream is listed as a queue")
	}
}
