package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// bins are the service binaries, built once for the tests that run them.
var bins = testenv.NewBuilds("autoprov-test-bin-",
	testenv.Build{Name: "scheduler", Pkg: "../../../../services/scheduler"},
	testenv.Build{Name: "infra", Pkg: "../../../../services/infra"},
	testenv.Build{Name: "deployer", Pkg: "../../../../services/deployer"})

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Close()
	os.Exit(code)
}

// serviceBinaries builds the three service binaries (once) and returns
// their folder.
func serviceBinaries(t *testing.T) string { return bins.Dir(t) }

// run runs the command line in-process with environ as its environment.
func run(t *testing.T, environ map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runWith(t, environ, nil, args...)
}

// runWith is run with Env.Environ set to list.
func runWith(t *testing.T, environ map[string]string, list func() []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runEnv(t, environ, Env{Environ: list}, args...)
}

// runStdin is run with stdin as Env.Stdin (nil: no terminal).
func runStdin(t *testing.T, environ map[string]string, stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runEnv(t, environ, Env{Stdin: stdin}, args...)
}

// runEnv runs the command line in-process with env's Environ and Stdin,
// environ as its environment, and its output captured.
func runEnv(t *testing.T, environ map[string]string, env Env, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env.Stdout, env.Stderr, env.Getenv = &out, &errOut, func(k string) string { return environ[k] }
	code = Run(ctx, args, env)
	return out.String(), errOut.String(), code
}

// fileWriter returns a function writing a file (and its folders) under
// dir and returning its path.
func fileWriter(t *testing.T, dir string) func(name, text string) string {
	return func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

func mustJSON(t *testing.T, text string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(text), v); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, text)
	}
}

// redisDB returns the URL of a Redis database of the test's own (the
// system's stream names are fixed) and a client on it.
func redisDB(t *testing.T) (string, *redis.Client) {
	t.Helper()
	url := testenv.RedisDB(t)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return url, rdb
}

func provisionRequest(t *testing.T, jobID, handle string) []byte {
	t.Helper()
	msg := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerHandle: handle}
	if err := msg.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := messages.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestStatus(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	ctx := context.Background()
	for i, h := range []string{"web-1", "web-2", "web-3"} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerQueue, Values: map[string]any{messages.DataField: provisionRequest(t, "job-"+h, h)}}).Err(); err != nil {
			t.Fatal(err, i)
		}
	}
	if err := rdb.XGroupCreate(ctx, messages.StreamProvisionerQueue, "infra", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: "infra-a", Streams: []string{messages.StreamProvisionerQueue, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_URL": url}

	out, errOut, code := run(t, env, "--json", "status")
	if code != 0 {
		t.Fatalf("status --json: exit %d: %s", code, errOut)
	}
	var report struct {
		Streams []streamStatus `json:"streams"`
		Servers map[string]int `json:"servers_by_status"`
	}
	mustJSON(t, out, &report)
	got := report.Streams
	if report.Servers != nil {
		t.Errorf("servers shown without DATABASE_URL: %v", report.Servers)
	}
	if len(got) != 4 {
		t.Fatalf("%d streams, want the 4 of the system:\n%s", len(got), out)
	}
	pq := got[0]
	if pq.Stream != messages.StreamProvisionerQueue || !pq.Exists || pq.Length != 3 || len(pq.Groups) != 1 {
		t.Fatalf("provisioner:queue: %+v", pq)
	}
	g := pq.Groups[0]
	if g.Group != "infra" || g.Lag != 2 || g.Pending != 1 || len(g.Consumers) != 1 || g.Consumers[0].Name != "infra-a" || g.Consumers[0].Pending != 1 || g.OldestPendingOwner != "infra-a" || g.OldestPendingDeliver != 1 {
		t.Fatalf("group: %+v", g)
	}
	if got[1].Stream != messages.StreamAnsibleDeployQueue || got[1].Exists {
		t.Fatalf("ansible:deploy:queue: %+v, want absent", got[1])
	}

	out, _, code = run(t, env, "queues", "--stream", messages.StreamProvisionerQueue)
	if code != 0 || !strings.Contains(out, "provisioner:queue") || !strings.Contains(out, "infra-a") || strings.Contains(out, "deploy:results") {
		t.Fatalf("queues --stream (exit %d):\n%s", code, out)
	}
	for _, col := range []string{"LAG", "PENDING", "OLDEST PENDING"} {
		if !strings.Contains(out, col) {
			t.Errorf("table lacks %s:\n%s", col, out)
		}
	}

	// With DATABASE_URL: servers by status and the runs in flight.
	dsn := testenv.EmptyDatabase(t)
	ctx2, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := store.Open(ctx2, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx2, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx2, `INSERT INTO servers (handle, address, status) VALUES
		('web-1', '192.0.2.1', 'READY'), ('web-2', '192.0.2.2', 'READY'), ('web-3', '192.0.2.3', 'PROVISIONING');
		INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, playbook, owner, started_at)
		VALUES ('job-web-3', 'provision', 'provisioner:queue', '1-0', 'web-3', 'web-3', 'setup_server.yml', 'infra-a', now() - interval '90 seconds')`); err != nil {
		t.Fatal(err)
	}
	env["DATABASE_URL"] = dsn
	out, errOut, code = run(t, env, "--json", "status")
	var fleet struct {
		Servers map[string]int `json:"servers_by_status"`
		Runs    []runStatus    `json:"runs_in_flight"`
	}
	mustJSON(t, out, &fleet)
	if code != 0 || fleet.Servers["READY"] != 2 || fleet.Servers["PROVISIONING"] != 1 || len(fleet.Runs) != 1 {
		t.Fatalf("status with DATABASE_URL: exit %d %s\n%s", code, errOut, out)
	}
	if r := fleet.Runs[0]; r.JobID != "job-web-3" || r.Owner != "infra-a" || r.Playbook != "setup_server.yml" || r.RunningSec < 80 {
		t.Fatalf("run in flight %+v", r)
	}
	out, _, code = run(t, env, "status")
	if code != 0 || !strings.Contains(out, "PROVISIONING") || !strings.Contains(out, "job-web-3") {
		t.Fatalf("status table with DATABASE_URL (exit %d):\n%s", code, out)
	}
}

// TestDeadLetters drives the dead-letter commands against dead letters a
// real consumer made: list, show, replay (the request as it was; the
// consumer gets it), a second replay refused, drop.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := map[string]string{"REDIS_URL": url}

	var mu sync.Mutex
	accept := false
	var accepted []*stream.Message
	handled := make(chan struct{}, 10)
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group: "infra", Streams: []string{messages.StreamProvisionerQueue}, Consumer: "infra-test",
		Block: 100 * time.Millisecond, StartID: "0",
	}, stream.HandlerFunc(func(_ context.Context, m *stream.Message) error {
		defer func() { handled <- struct{}{} }()
		mu.Lock()
		defer mu.Unlock()
		if _, err := messages.DecodeProvisionerMessage(m.Data()); err != nil {
			return stream.Permanent("invalid_message", err)
		}
		if !accept {
			return stream.Permanent("rejected", errFake("server web-9 is not registered"))
		}
		accepted = append(accepted, m)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wait := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-handled:
			case <-time.After(30 * time.Second):
				t.Fatal("the consumer handled nothing")
			}
		}
	}
	waitDead := func(n int64) {
		t.Helper()
		for range 300 {
			if l, _ := rdb.XLen(context.Background(), messages.StreamProvisionerQueue+stream.DeadLetterSuffix).Result(); l == n {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no %d dead letters", n)
	}
	pub := func(data []byte) {
		t.Helper()
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: messages.StreamProvisionerQueue, Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pub(provisionRequest(t, "job-orig", "web-9"))
	pub([]byte("\xc1 not msgpack"))
	wait(2)
	waitDead(2)

	// list
	out, errOut, code := run(t, env, "--json", "dead", "list", messages.StreamProvisionerQueue)
	if code != 0 {
		t.Fatalf("dead list: exit %d: %s", code, errOut)
	}
	var page struct {
		Letters []letterView `json:"letters"`
	}
	mustJSON(t, out, &page)
	if len(page.Letters) != 2 {
		t.Fatalf("%d dead letters, want 2:\n%s", len(page.Letters), out)
	}
	// Handled concurrently: their order is not the publishing order.
	good, bad := page.Letters[0], page.Letters[1]
	if good.Reason != "rejected" {
		good, bad = bad, good
	}
	if good.Reason != "rejected" || !strings.Contains(good.Error, "web-9") || good.Group != "infra" || good.Consumer != "infra-test" || bad.Reason != "invalid_message" {
		t.Fatalf("dead letters: %+v", page.Letters)
	}
	out, _, code = run(t, env, "dlq", "list", messages.StreamProvisionerQueue+stream.DeadLetterSuffix)
	if code != 0 || !strings.Contains(out, good.ID) || !strings.Contains(out, "invalid_message") {
		t.Fatalf("dlq list (the :dead name; exit %d):\n%s", code, out)
	}

	// show: the payload decoded
	out, _, code = run(t, env, "--json", "dead", "show", messages.StreamProvisionerQueue, good.ID)
	var shown letterView
	mustJSON(t, out, &shown)
	payload, _ := shown.Payload.(map[string]any)
	if code != 0 || payload["server_handle"] != "web-9" || payload["job_id"] != "job-orig" {
		t.Fatalf("dead show (exit %d):\n%s", code, out)
	}
	out, _, code = run(t, env, "dead", "show", messages.StreamProvisionerQueue, bad.ID)
	if code != 0 || !strings.Contains(out, "not msgpack") {
		t.Fatalf("dead show of a bad payload (exit %d):\n%s", code, out)
	}

	// replay: the same request, the origin recorded, the consumer gets it
	mu.Lock()
	accept = true
	mu.Unlock()
	out, errOut, code = run(t, env, "--json", "dead", "replay", messages.StreamProvisionerQueue, good.ID)
	if code != 0 {
		t.Fatalf("dead replay: exit %d: %s", code, errOut)
	}
	var replay struct {
		NewID string `json:"new_id"`
		JobID string `json:"job_id"`
	}
	mustJSON(t, out, &replay)
	if replay.NewID == "" || replay.JobID != "job-orig" {
		t.Fatalf("replay: %s", out)
	}
	wait(1)
	mu.Lock()
	if len(accepted) != 1 {
		mu.Unlock()
		t.Fatalf("the consumer accepted %d requests, want the replayed one", len(accepted))
	}
	m := accepted[0]
	mu.Unlock()
	req, err := messages.DecodeProvisionerMessage(m.Data())
	if err != nil || req.JobID != replay.JobID || req.ServerHandle != "web-9" || m.ID != replay.NewID {
		t.Fatalf("replayed request %+v (%v), entry %s; want job %s as %s", req, err, m.ID, replay.JobID, replay.NewID)
	}
	if m.Values[stream.ReplayFieldDeadID] != good.ID || m.Values[stream.ReplayFieldOriginalID] != good.OriginalID {
		t.Fatalf("replayed entry does not name its origin: %v", m.Values)
	}

	// once only
	_, errOut, code = run(t, env, "dead", "replay", messages.StreamProvisionerQueue, good.ID)
	if code != 1 || !strings.Contains(errOut, "already replayed") {
		t.Fatalf("second replay: exit %d: %s", code, errOut)
	}
	out, _, _ = run(t, env, "dead", "list", messages.StreamProvisionerQueue)
	if !strings.Contains(out, replay.NewID) {
		t.Fatalf("list does not show the replay:\n%s", out)
	}

	// a payload that does not decode is replayed only --as-is
	_, errOut, code = run(t, env, "dead", "replay", messages.StreamProvisionerQueue, bad.ID)
	if code != 1 || !strings.Contains(errOut, "--as-is") {
		t.Fatalf("replay of a bad payload: exit %d: %s", code, errOut)
	}

	// drop
	out, _, code = run(t, env, "dead", "drop", messages.StreamProvisionerQueue, good.ID, bad.ID)
	if code != 0 || !strings.Contains(out, "dropped 2 of 2") {
		t.Fatalf("drop (exit %d):\n%s", code, out)
	}
	_, errOut, code = run(t, env, "dead", "drop", messages.StreamProvisionerQueue, good.ID)
	if code != 1 || !strings.Contains(errOut, "not dead letters") {
		t.Fatalf("drop of a dropped letter: exit %d: %s", code, errOut)
	}
	if n, _ := rdb.XLen(context.Background(), messages.StreamProvisionerQueue+stream.DeadLetterSuffix).Result(); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
	_, _, code = run(t, env, "dead", "show", messages.StreamProvisionerQueue, good.ID)
	if code != 1 {
		t.Fatalf("show of a dropped letter: exit %d", code)
	}
}

type errFake string

func (e errFake) Error() string { return string(e) }

func TestErrorsAndUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ map[string]string
		args    []string
		code    int
		want    string
		never   string
	}{
		{"unknown command", nil, []string{"frobnicate"}, 2, "unexpected argument", ""},
		{"missing argument", nil, []string{"dead", "show", "provisioner:queue"}, 2, "expected", ""},
		{"bad settings", map[string]string{"REDIS_URL": "mysql://u:hunter2@h/0"}, []string{"status"}, 2, "REDIS_URL", "hunter2"},
		{"Redis down", map[string]string{"REDIS_URL": "redis://:hunter2@127.0.0.1:1/0"}, []string{"status"}, 1, "connect to Redis", "hunter2"},
		{"bad dead letter id", map[string]string{"REDIS_URL": testenv.RedisURL(t)}, []string{"dead", "show", "provisioner:queue", "nope"}, 1, "nope", ""},
		{"help", nil, []string{"--help"}, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := run(t, tt.environ, tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errOut, tt.code, tt.want)
			}
			if tt.never != "" && strings.Contains(out+errOut, tt.never) {
				t.Fatalf("output shows %q:\n%s%s", tt.never, out, errOut)
			}
		})
	}
}

func TestProbe(t *testing.T) {
	t.Parallel()
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("draining"))
	}))
	defer srv.Close()
	if _, errOut, code := run(t, nil, "probe", srv.URL+"/readyz"); code != 0 {
		t.Fatalf("probe of a ready server: exit %d %s", code, errOut)
	}
	status = http.StatusServiceUnavailable
	if _, errOut, code := run(t, nil, "probe", srv.URL+"/readyz"); code != 1 || !strings.Contains(errOut, "503") {
		t.Fatalf("probe of a draining server: exit %d %s", code, errOut)
	}
	if _, _, code := run(t, nil, "probe", "ftp://x/"); code != 2 {
		t.Fatalf("probe of a non-http URL: exit %d", code)
	}
	if _, _, code := run(t, nil, "probe", "http://127.0.0.1:1/readyz"); code != 1 {
		t.Fatalf("probe of a closed port: exit %d", code)
	}
}

// TestValidate runs the real service binaries' configuration checks.
func TestValidate(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	dir := t.TempDir()
	write := fileWriter(t, dir)
	env := map[string]string{"PATH": os.Getenv("PATH")}

	good := write("good.env", "REDIS_URL=redis://redis:6379/0\nDATABASE_URL=postgres://u:hunter2@db/autoprov\nLOG_LEVEL=debug\nSTREAM_CONCURRENCY=8\n")
	out, errOut, code := run(t, env, "--env-file", good, "validate", "--bin-dir", bin)
	if code != 0 || strings.Count(out, "ok ") != 3 {
		t.Fatalf("valid file: exit %d\n%s%s", code, out, errOut)
	}

	bad := write("bad.env", "REDIS_URL=redis://redis:6379/0\nDATABASE_URL=mysql://u:hunter2@db/x\nLOG_LEVEL=loud\nSTREAM_CONCURRENCY=0\nSSH_HOST_KEY_POLICY=trust-me\n")
	out, _, code = run(t, env, "--env-file", bad, "validate", "--bin-dir", bin)
	if code != 1 {
		t.Fatalf("invalid file: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{"FAIL infra configuration", "FAIL scheduler configuration", "LOG_LEVEL", "DATABASE_URL", "STREAM_CONCURRENCY", "SSH_HOST_KEY_POLICY"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") {
		t.Errorf("validate prints the database password:\n%s", out)
	}
	var report struct {
		OK     bool          `json:"ok"`
		Checks []checkResult `json:"checks"`
	}
	out, _, code = run(t, env, "--json", "--env-file", bad, "validate", "--bin-dir", bin, "--service", "infra")
	mustJSON(t, out, &report)
	if code != 1 || report.OK || len(report.Checks) != 1 || len(report.Checks[0].Problems) != 4 {
		t.Fatalf("--json validate of infra: exit %d\n%s", code, out)
	}

	// Inventories and playbooks, with Ansible's own parsers.
	goodInv := write("hosts.ini", "[web]\nweb-1 ansible_host=192.0.2.10\n")
	badInv := write("broken.yml", "all:\n  hosts: [unclosed\n")
	books := filepath.Join(dir, "ansible")
	if err := os.MkdirAll(filepath.Join(books, "playbooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "playbooks", "ok.yml"), []byte("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "playbooks", "broken.yml"), []byte("- hosts: all\n  tasks:\n    - ansible.builtin.ping:\n      no_such_keyword: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(t, env, "--env-file", good, "validate", "--bin-dir", bin, "--service", "infra",
		"--inventory", goodInv, "--inventory", badInv, "--ansible-dir", books)
	if code != 1 {
		t.Fatalf("validate with a broken inventory and playbook: exit %d\n%s", code, out)
	}
	for _, want := range []string{"ok   inventory " + goodInv, "FAIL inventory " + badInv, "ok   playbook " + filepath.Join(books, "playbooks", "ok.yml"), "FAIL playbook " + filepath.Join(books, "playbooks", "broken.yml"), "line",
		"FAIL ansible-lint " + books, "broken.yml:1: load-failure"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// A playbook that parses but breaks the lint rules.
	lintOnly := filepath.Join(dir, "lintonly")
	if err := os.MkdirAll(filepath.Join(lintOnly, "playbooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lintOnly, "playbooks", "p.yml"), []byte("- hosts: all\n  tasks:\n    - shell: echo hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(t, env, "--env-file", good, "validate", "--bin-dir", bin, "--service", "infra", "--ansible-dir", lintOnly)
	if code != 1 || !strings.Contains(out, "ok   playbook") || !strings.Contains(out, "p.yml:1: name[play]") || !strings.Contains(out, "p.yml:3: no-changed-when") {
		t.Fatalf("a playbook breaking the lint rules: exit %d\n%s", code, out)
	}
	if out, _, code = run(t, env, "--env-file", good, "validate", "--bin-dir", bin, "--service", "infra", "--ansible-dir", lintOnly, "--no-lint"); code != 0 {
		t.Fatalf("--no-lint: exit %d\n%s", code, out)
	}

	// The repository's own playbooks pass. Linting them took more than 5
	// minutes in CI, beside the other tests and the container lane's image
	// builds: far more than a check's default limit (2m).
	out, _, code = run(t, env, "--env-file", good, "validate", "--bin-dir", bin, "--service", "infra", "--ansible-dir", "../../../../ansible",
		"--timeout", "15m")
	if code != 0 || strings.Count(out, "ok   playbook") < 4 {
		t.Fatalf("the repository's playbooks: exit %d\n%s", code, out)
	}

	// A missing binary is a problem, not a crash.
	out, _, code = run(t, env, "--env-file", good, "validate", "--bin-dir", dir, "--service", "infra")
	if code != 1 || !strings.Contains(out, "FAIL infra configuration") {
		t.Fatalf("missing binary: exit %d\n%s", code, out)
	}
}

// fakeInfra plays infra's side of the wire contract for the job commands:
// it takes the next request from provisioner:queue, checks it decodes,
// appends progress events and a result with the given status.
func fakeInfra(t *testing.T, rdb *redis.Client, status messages.Status) <-chan *messages.ProvisionerMessage {
	t.Helper()
	got := make(chan *messages.ProvisionerMessage, 1)
	go func() {
		ctx := context.Background()
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{messages.StreamProvisionerQueue, "0-0"}, Count: 1, Block: 30 * time.Second}).Result()
		if err != nil {
			close(got)
			return
		}
		m := res[0].Messages[0]
		req, err := messages.DecodeProvisionerMessage((&stream.Message{Values: m.Values}).Data())
		if err != nil {
			close(got)
			return
		}
		got <- req
		now := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
		events := []messages.ProgressEvent{
			{Type: messages.EventRunStarted},
			{Type: messages.EventPlayStarted, Play: "Provision the server"},
			{Type: messages.EventTaskStarted, Play: "Provision the server", Task: "deploy_user : Create the deploy user"},
			{Type: messages.EventHostChanged, Host: req.ServerHandle, Task: "deploy_user : Create the deploy user"},
			{Type: messages.EventRunFinished, Status: status},
		}
		for i := range events {
			e := &events[i]
			e.JobID, e.Seq, e.Time = req.JobID, int64(i+1), now
			data, err := messages.Encode(e)
			if err != nil {
				panic(err)
			}
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindProvision, req.JobID), Values: map[string]any{messages.DataField: data}})
		}
		r := messages.NewProvisionerResult(req, m.ID)
		r.Status = status
		if status != messages.StatusSucceeded {
			r.Error = &messages.ErrorInfo{Kind: "play_failed", Message: "task Create the deploy user failed"}
		}
		data, err := messages.Encode(r)
		if err != nil {
			panic(err)
		}
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerResults, Values: map[string]any{messages.DataField: data}})
	}()
	return got
}

func TestProvisionFollowCancel(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	env := map[string]string{"REDIS_URL": url}

	// A result of another job on the results stream is not ours.
	other := messages.NewProvisionerResult(&messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: "job-other"}, ServerHandle: "x"}, "1-0")
	other.Status = messages.StatusFailed
	data, _ := messages.Encode(other)
	rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: messages.StreamProvisionerResults, Values: map[string]any{messages.DataField: data}})

	got := fakeInfra(t, rdb, messages.StatusSucceeded)
	out, errOut, code := run(t, env, "provision", "web-1", "--recovery", "--job-id", "job-42", "--follow", "--timeout", "1m")
	if code != 0 {
		t.Fatalf("provision --follow: exit %d\n%s%s", code, out, errOut)
	}
	req := <-got
	if req == nil || req.JobID != "job-42" || req.ServerHandle != "web-1" || !req.IsRecovery || req.ForceReinstall || req.CreatedAt == "" {
		t.Fatalf("request on the queue: %+v", req)
	}
	for _, want := range []string{"queued job job-42", "play  Provision the server", "task  deploy_user : Create the deploy user", "web-1: changed", "result: succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// follow of a job that is over: its events and result, at once, with
	// its kind given or not; given another kind, the job is not found.
	for _, args := range [][]string{{"follow", "job-42"}, {"follow", "--kind", "provision", "job-42"}} {
		out, _, code = run(t, env, args...)
		if code != 0 || !strings.Contains(out, "web-1: changed") || !strings.Contains(out, "result: succeeded") {
			t.Fatalf("%q of a finished job: exit %d\n%s", args, code, out)
		}
	}
	if out, _, code := run(t, env, "follow", "--kind", "deploy", "job-42", "--timeout", "1s"); code != 1 || strings.Contains(out, "web-1: changed") {
		t.Fatalf("follow --kind deploy of a provisioning job: exit %d\n%s", code, out)
	}

	// A failed job: exit 1, the error shown; --json prints the result.
	rdb.Del(context.Background(), messages.StreamProvisionerQueue)
	got = fakeInfra(t, rdb, messages.StatusFailed)
	out, _, code = run(t, env, "--json", "provision", "web-2", "--follow", "--timeout", "1m")
	if code != 1 {
		t.Fatalf("provision --follow of a failing job: exit %d\n%s", code, out)
	}
	req = <-got
	var res map[string]any
	mustJSON(t, out, &res)
	if res["status"] != "failed" || res["job_id"] != req.JobID || req.JobID == "" {
		t.Fatalf("result %v for request %+v", res, req)
	}

	// Mistakes are refused before anything is queued.
	rdb.Del(context.Background(), messages.StreamProvisionerQueue)
	for _, args := range [][]string{
		{"provision", "web-1", "--recovery", "--reinstall"},
		{"provision", "not a handle!"},
	} {
		if _, _, code := run(t, env, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if n, _ := rdb.XLen(context.Background(), messages.StreamProvisionerQueue).Result(); n != 0 {
		t.Fatalf("%d requests queued by refused commands", n)
	}

	// follow gives up after its timeout.
	if _, errOut, code := run(t, env, "follow", "job-never", "--timeout", "2s"); code != 1 || !strings.Contains(errOut, "no result") {
		t.Fatalf("follow of a job without result: exit %d %s", code, errOut)
	}

	// cancel sets the key the running job polls, of the job's kind (here
	// found from its progress stream), with an expiry.
	if out, _, code := run(t, env, "cancel", "job-42"); code != 0 || !strings.Contains(out, "job-42") {
		t.Fatalf("cancel: exit %d %s", code, out)
	}
	ttl, err := rdb.TTL(context.Background(), messages.CancelKey(messages.JobKindProvision, "job-42")).Result()
	if err != nil || ttl <= 23*time.Hour {
		t.Fatalf("cancel key TTL %v (%v), want about 24h", ttl, err)
	}
	if n, _ := rdb.Exists(context.Background(), messages.CancelKey(messages.JobKindDeploy, "job-42")).Result(); n != 0 {
		t.Errorf("cancel of a provisioning job set the deploy cancel key too")
	}
	// --kind names the kind; a job not started yet without it gets both
	// kinds' keys (its kind is not known).
	for _, tc := range []struct {
		args []string
		want []messages.JobKind
	}{
		{[]string{"--json", "cancel", "--kind", "deploy", "job-d"}, []messages.JobKind{messages.JobKindDeploy}},
		{[]string{"--json", "cancel", "job-q"}, messages.JobKinds()},
	} {
		out, _, code := run(t, env, tc.args...)
		if code != 0 {
			t.Fatalf("%q: exit %d %s", tc.args, code, out)
		}
		var res struct {
			JobID      string   `json:"job_id"`
			CancelKeys []string `json:"cancel_keys"`
		}
		mustJSON(t, out, &res)
		var want []string
		for _, k := range tc.want {
			want = append(want, messages.CancelKey(k, res.JobID))
		}
		if strings.Join(res.CancelKeys, " ") != strings.Join(want, " ") {
			t.Errorf("%q: cancel keys %q, want %q", tc.args, res.CancelKeys, want)
		}
		for _, k := range messages.JobKinds() {
			key := messages.CancelKey(k, res.JobID)
			if n, _ := rdb.Exists(context.Background(), key).Result(); (n == 1) != slices.Contains(want, key) {
				t.Errorf("%q: %s exists: %v", tc.args, key, n == 1)
			}
		}
	}
	if _, _, code := run(t, env, "cancel", "--kind", "other", "job-x"); code != 2 {
		t.Errorf("cancel --kind other: exit %d, want 2", code)
	}
}
