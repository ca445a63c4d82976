package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify/notifytest"
)

// bins is the scheduler binary, built once for the tests that run it.
var bins = testenv.NewBuilds("scheduler-test-bin-", testenv.Build{Name: "scheduler", Pkg: "."})

// TestMain removes the binary the tests built: a test process leaves
// nothing behind in the temp dir.
func TestMain(m *testing.M) {
	code := m.Run()
	bins.Close()
	os.Exit(code)
}

// schedulerBinary returns the scheduler binary (built once per process).
func schedulerBinary(t *testing.T) string { return bins.Path(t, "scheduler") }

// world is a database, a Redis and the scheduler binary for one test.
type world struct {
	t     *testing.T
	bin   string
	dsn   string
	db    *pgxpool.Pool
	fleet *fleet.Store
	redis *testenv.RedisServer
	rdb   *redis.Client
	env   []string
}

func newWorld(t *testing.T, bin string, env ...string) *world {
	t.Helper()
	dsn := testenv.Postgres(t)
	db, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	rs := testenv.StartRedisServer(t)
	w := &world{t: t, bin: bin, dsn: dsn, db: db, fleet: fleet.New(db, fleet.Options{}), redis: rs, rdb: rs.Client()}
	w.env = append([]string{
		"REDIS_URL=" + rs.URL(), "DATABASE_URL=" + dsn, "LOG_FORMAT=json", "TICK_INTERVAL=200ms",
		"HEALTH_ENABLED=false", "RETRY_BACKOFF=1s", "SHUTDOWN_GRACE=5s",
	}, env...)
	return w
}

// start starts a scheduler and waits until it is ready.
func (w *world) start(extra ...string) *testenv.Process {
	w.t.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(w.t))
	p := testenv.StartBinary(w.t, w.bin, testenv.BinaryEnv(append(append([]string{"ADMIN_ADDR=" + admin}, w.env...), extra...)...))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	return p
}

func (w *world) addServers(prefix string, n int) []string {
	w.t.Helper()
	var handles []string
	for i := range n {
		h := fmt.Sprintf("%s-%03d", prefix, i)
		handles = append(handles, h)
		if _, err := w.db.Exec(context.Background(), `INSERT INTO servers (handle, address) VALUES ($1, $2)`,
			h, fmt.Sprintf("192.0.2.%d", i%250+1)); err != nil {
			w.t.Fatal(err)
		}
	}
	return handles
}

// queued returns the ProvisionerMessages in provisioner:queue, by server.
func (w *world) queued() map[string][]*messages.ProvisionerMessage {
	w.t.Helper()
	entries, err := w.rdb.XRange(context.Background(), messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil && err != redis.Nil {
		w.t.Fatal(err)
	}
	out := map[string][]*messages.ProvisionerMessage{}
	for _, e := range entries {
		data, _ := e.Values[messages.DataField].(string)
		m, err := messages.DecodeProvisionerMessage([]byte(data))
		if err != nil {
			w.t.Fatalf("entry %s: %v", e.ID, err)
		}
		out[m.ServerHandle] = append(out[m.ServerHandle], m)
	}
	return out
}

// answer publishes a result for each queued job of handles, as infra would.
func (w *world) answer(handles []string, status messages.Status, errMsg string) {
	w.t.Helper()
	q := w.queued()
	for _, h := range handles {
		msgs := q[h]
		if len(msgs) == 0 {
			w.t.Fatalf("no message queued for %s", h)
		}
		m := msgs[len(msgs)-1]
		res := messages.NewProvisionerResult(m, "1-0")
		if status == messages.StatusSucceeded {
			res.Succeed()
		} else {
			res.Fail(status, messages.KindPlaybookFailed, errMsg)
		}
		data, err := messages.Encode(res)
		if err != nil {
			w.t.Fatal(err)
		}
		if err := w.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: messages.StreamProvisionerResults,
			Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *world) waitStatus(handles []string, status string, timeout time.Duration) {
	w.t.Helper()
	testenv.WaitFor(w.t, timeout, fmt.Sprintf("%d servers %s", len(handles), status), func() bool {
		var n int
		if err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM servers WHERE handle = ANY($1) AND status = $2`,
			handles, status).Scan(&n); err != nil {
			w.t.Fatal(err)
		}
		return n == len(handles)
	})
}

// TestKillBetweenStateChangeAndPublish: servers are queued (QUEUED is
// durable, with its message in the outbox) while Redis is down, the
// scheduler is killed with SIGKILL, Redis comes back, a new scheduler
// publishes every message exactly once: nothing is lost, nothing doubled.
func TestKillBetweenStateChangeAndPublish(t *testing.T) {
	t.Parallel()
	w := newWorld(t, schedulerBinary(t))
	p := w.start()
	w.redis.Stop()
	handles := w.addServers("k", 40)
	w.waitStatus(handles, fleet.StatusQueued, time.Minute)
	testenv.WaitFor(t, 30*time.Second, "a failed relay attempt", func() bool {
		return strings.Contains(p.Stderr(), "relay failed")
	})
	p.Signal(syscall.SIGKILL)
	p.Wait(30 * time.Second)
	var backlog int
	if err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&backlog); err != nil {
		t.Fatal(err)
	}
	if backlog != 40 {
		t.Fatalf("outbox holds %d unpublished messages after the kill, want 40", backlog)
	}
	w.redis.Start()
	w.start()
	w.waitStatus(handles, fleet.StatusProvisioning, time.Minute)
	q := w.queued()
	for _, h := range handles {
		if len(q[h]) != 1 {
			t.Errorf("%s has %d messages in provisioner:queue, want 1", h, len(q[h]))
		}
	}
	if len(q) != 40 {
		t.Errorf("messages for %d servers, want 40", len(q))
	}
}

// TestTwoReplicasOneMessagePerServer runs two schedulers without leader
// election (so both tick and relay at once): every server gets exactly one
// message.
func TestTwoReplicasOneMessagePerServer(t *testing.T) {
	t.Parallel()
	w := newWorld(t, schedulerBinary(t), "TICK_LEADER_ELECTION=false", "TICK_INTERVAL=50ms", "TICK_RELAY_BATCH=7")
	w.start()
	w.start()
	for round := range 3 { // servers arrive while both replicas run
		handles := w.addServers(fmt.Sprintf("r%d", round), 100)
		w.waitStatus(handles, fleet.StatusProvisioning, 2*time.Minute)
	}
	q := w.queued()
	if len(q) != 300 {
		t.Errorf("messages for %d servers, want 300", len(q))
	}
	for h, msgs := range q {
		if len(msgs) != 1 {
			t.Errorf("%s got %d messages", h, len(msgs))
		}
	}
	var queuedEvents int
	if err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM server_history WHERE event = 'queued'`).Scan(&queuedEvents); err != nil {
		t.Fatal(err)
	}
	if queuedEvents != 300 {
		t.Errorf("%d queued events in history, want 300", queuedEvents)
	}
}

// TestNotificationsExactlyOnceAcrossKill: notifications delivered before a
// kill -9 are not repeated, pending ones are delivered once after it.
func TestNotificationsExactlyOnceAcrossKill(t *testing.T) {
	t.Parallel()
	slack := notifytest.NewSlack("/services/T1/B1/secretpart")
	hs := httptest.NewServer(slack)
	t.Cleanup(hs.Close)
	w := newWorld(t, schedulerBinary(t), "RETRY_LIMIT=1",
		"SLACK_WEBHOOK_URL_REF=env:AUTOPROV_SECRET_SLACK", "AUTOPROV_SECRET_SLACK="+hs.URL+slack.Path,
		"NOTIFY_DIGEST_THRESHOLD=5")
	p := w.start()
	// Phase 1: three servers become READY, one message each.
	ready := w.addServers("ok", 3)
	w.waitStatus(ready, fleet.StatusProvisioning, time.Minute)
	w.answer(ready, messages.StatusSucceeded, "")
	w.waitStatus(ready, fleet.StatusReady, time.Minute)
	testenv.WaitFor(t, time.Minute, "three messages", func() bool { return len(slack.Messages()) == 3 })
	// Phase 2: Slack fails; ten servers fail for good; the scheduler dies.
	slack.FailNext(1_000_000, 500)
	failed := w.addServers("bad", 10)
	w.waitStatus(failed, fleet.StatusProvisioning, time.Minute)
	w.answer(failed, messages.StatusFailed, "task Install packages failed")
	w.waitStatus(failed, fleet.StatusFailed, time.Minute)
	testenv.WaitFor(t, time.Minute, "a failed delivery", func() bool {
		return strings.Contains(p.Stderr(), "notification not delivered")
	})
	p.Signal(syscall.SIGKILL)
	p.Wait(30 * time.Second)
	slack.FailNext(0, 0)
	w.start()
	testenv.WaitFor(t, time.Minute, "the digest", func() bool { return len(slack.Messages()) == 4 })
	seen := map[string]int{}
	for _, m := range slack.Messages() {
		for _, h := range append(append([]string{}, ready...), failed...) {
			if strings.Contains(m.Text, h+" ") || strings.Contains(m.Text, h+"\n") || strings.Contains(m.Text, h+" (") {
				seen[h]++
			}
		}
	}
	for _, h := range append(append([]string{}, ready...), failed...) {
		if seen[h] != 1 {
			t.Errorf("%s notified %d times, want exactly once", h, seen[h])
		}
	}
	digest := slack.Messages()[3].Text
	if !strings.HasPrefix(digest, "10 servers changed state: 10 FAILED") || !strings.Contains(digest, "task Install packages failed") {
		t.Errorf("digest: %q", digest)
	}
	// The receiver has the digest a moment before the delivery is committed.
	testenv.WaitFor(t, 30*time.Second, "every notification recorded as delivered", func() bool {
		var pending int
		err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM notifications n WHERE NOT EXISTS
			(SELECT 1 FROM notification_deliveries d WHERE d.notification_id = n.id)`).Scan(&pending)
		return err == nil && pending == 0
	})
	if n := len(slack.Messages()); n != 4 {
		t.Errorf("%d messages, want 4", n)
	}
}

// TestCLI drives the operators' commands against a running scheduler.
func TestCLI(t *testing.T) {
	t.Parallel()
	bin := schedulerBinary(t)
	w := newWorld(t, bin)
	w.start()
	handles := w.addServers("c", 2)
	w.waitStatus(handles, fleet.StatusProvisioning, time.Minute)
	w.answer(handles, messages.StatusSucceeded, "")
	w.waitStatus(handles, fleet.StatusReady, time.Minute)
	cli := func(args ...string) (string, string, int) {
		return testenv.RunBinary(t, bin, testenv.BinaryEnv("DATABASE_URL="+w.dsn, "USER=alice"), append([]string{"servers"}, args...)...)
	}
	out, errOut, code := cli("list", "--status", "ready")
	if code != 0 || !strings.Contains(out, "c-000") || !strings.Contains(out, "READY") {
		t.Fatalf("list: %d %s %s", code, out, errOut)
	}
	if out, _, code = cli("pause", "c-001", "--reason", "maintenance"); code != 0 || !strings.Contains(out, "c-001 paused by alice") {
		t.Errorf("pause: %d %s", code, out)
	}
	if out, _, code = cli("rebuild", "c-001", "--by", "bob"); code != 0 || !strings.Contains(out, "rebuild of c-001 requested by bob") {
		t.Errorf("rebuild: %d %s", code, out)
	}
	// Paused: the request waits.
	time.Sleep(time.Second)
	if n := len(w.queued()["c-001"]); n != 1 {
		t.Errorf("a paused server got a message (%d)", n)
	}
	if _, _, code = cli("resume", "c-001"); code != 0 {
		t.Errorf("resume: %d", code)
	}
	testenv.WaitFor(t, time.Minute, "the rebuild message", func() bool {
		m := w.queued()["c-001"]
		return len(m) == 2 && m[1].ForceReinstall
	})
	// The relay publishes, then commits the move to PROVISIONING: the
	// message may be read before the commit.
	testenv.WaitFor(t, 30*time.Second, "c-001 to show PROVISIONING", func() bool {
		out, _, code = cli("show", "c-001")
		return code == 0 && strings.Contains(out, "c-001  PROVISIONING")
	})
	for _, want := range []string{"c-001  PROVISIONING", "requested", "bob", "paused", "alice", "maintenance", "queued"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if out, _, code = cli("counts", "--json"); code != 0 || !strings.Contains(out, `"READY": 1`) {
		t.Errorf("counts: %d %s", code, out)
	}
	if _, errOut, code = cli("show", "nope"); code != 1 || !strings.Contains(errOut, "server not found") {
		t.Errorf("show unknown: %d %s", code, errOut)
	}
	// Owners: set by an operator, shown, filtered on; a bad id is refused.
	const projA = "aaaaaaaa-0000-4000-8000-000000000001"
	if out, errOut, code = cli("set-projects", "c-000", "--project", strings.ToUpper(projA), "--reason", "tenant A"); code != 0 ||
		!strings.Contains(out, "c-000 is owned by "+projA+" (set by alice)") {
		t.Errorf("set-projects: %d %s %s", code, out, errOut)
	}
	if out, _, code = cli("list", "--project", projA); code != 0 || !strings.Contains(out, "PROJECTS") ||
		!strings.Contains(out, "aaaaaaaa") || strings.Contains(out, "c-001") {
		t.Errorf("list --project: %d %s", code, out)
	}
	if out, _, code = cli("show", "c-000"); code != 0 || !strings.Contains(out, "projects: "+projA+" (set by an operator)") {
		t.Errorf("show: %d %s", code, out)
	}
	if out, _, code = cli("show", "c-000", "--json"); code != 0 || !strings.Contains(out, `"projects": [`) {
		t.Errorf("show --json: %d %s", code, out)
	}
	if _, errOut, code = cli("set-projects", "c-000", "--project", "tenant-b"); code != 1 || !strings.Contains(errOut, "not a project id") {
		t.Errorf("set-projects with a bad id: %d %s", code, errOut)
	}
	if _, _, code = cli("explode", "c-000"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if _, errOut, code = cli("list", "--status", "BOGUS"); code != 1 || !strings.Contains(errOut, "unknown status") {
		t.Errorf("bad status: %d %s", code, errOut)
	}
}

// TestRulesErrorStopsStart: a rules file with errors stops the service at
// start with the file, line and rule named.
func TestRulesErrorStopsStart(t *testing.T) {
	t.Parallel()
	bin := schedulerBinary(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "playbooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, []byte("rules:\n  - name: web\n    playbooks: [nginx.yml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := testenv.RunBinary(t, bin, testenv.BinaryEnv("DATABASE_URL="+testenv.Postgres(t), "REDIS_URL="+testenv.RedisURL(t),
		"RULES_FILE="+rules, "PLAYBOOK_DIR="+dir, fmt.Sprintf("ADMIN_ADDR=127.0.0.1:%d", testenv.FreePort(t))))
	if code == 0 || !strings.Contains(stderr, rules+`:3: rule "web": playbook "nginx.yml" does not exist`) {
		t.Errorf("exit %d; stderr:\n%s", code, stderr)
	}
}

// TestSignedRequests: with REQUEST_SIGNING_KEY_ID and REQUEST_SIGNING_KEY
// set, every request the scheduler publishes carries a signature infra's
// verifier accepts for provisioner:queue, and the key appears nowhere in
// the scheduler's output.
func TestSignedRequests(t *testing.T) {
	t.Parallel()
	const key = "scheduler-signing-key-0123456789abcdef-0123456789"
	w := newWorld(t, schedulerBinary(t), "REQUEST_SIGNING_KEY_ID=scheduler-1", "REQUEST_SIGNING_KEY="+key)
	p := w.start()
	handles := w.addServers("signed", 3)
	w.waitStatus(handles, fleet.StatusProvisioning, time.Minute)

	v, err := messages.NewVerifier(messages.VerifierKey{ID: "scheduler-1", Key: []byte(key), Streams: []string{messages.StreamProvisionerQueue}})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := w.rdb.XRange(context.Background(), messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(handles) {
		t.Fatalf("%d entries queued, want %d", len(entries), len(handles))
	}
	for _, e := range entries {
		data, _ := e.Values[messages.DataField].(string)
		sig, _ := e.Values["sig"].(string)
		if id, err := v.Verify(messages.StreamProvisionerQueue, []byte(data), sig); err != nil || id != "scheduler-1" {
			t.Errorf("entry %s: signature %q: key %q, %v", e.ID, sig, id, err)
		}
	}
	p.Signal(syscall.SIGTERM)
	p.Wait(30 * time.Second)
	if out := p.Stdout() + p.Stderr(); strings.Contains(out, key) {
		t.Error("the signing key appears in the scheduler's output")
	}
}

// TestBadSigningKeyStopsStart: a signing key too short to be safe stops
// the start with an error naming the setting, not the key.
func TestBadSigningKeyStopsStart(t *testing.T) {
	t.Parallel()
	w := newWorld(t, schedulerBinary(t), "REQUEST_SIGNING_KEY_ID=scheduler-1", "REQUEST_SIGNING_KEY=too-short-a-key")
	p := testenv.StartBinary(t, w.bin, testenv.BinaryEnv(append([]string{"ADMIN_ADDR=127.0.0.1:0"}, w.env...)...))
	if code := p.Wait(time.Minute); code == 0 {
		t.Fatal("the scheduler started with a short signing key")
	}
	out := p.Stdout() + p.Stderr()
	if !strings.Contains(out, "REQUEST_SIGNING_KEY") {
		t.Errorf("the error does not name REQUEST_SIGNING_KEY: %s", out)
	}
	if strings.Contains(out, "too-short-a-key") {
		t.Error("the error shows the key")
	}
}
