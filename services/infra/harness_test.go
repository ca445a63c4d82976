package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The end-to-end harness runs the real infra binary (with its runguard)
// against real Redis, Postgres and loopback sshd test hosts, with small test
// playbooks in testdata/ansible that stand in for the real ones (which would
// reconfigure the test machine itself): they log start and end of each run
// to out/<host>.log next to the playbooks and obey control/<host>.json
// ({"sleep": seconds, "fail": true}).

// bins are infra and runguard, built once per test process into one
// directory (infra finds runguard next to itself), as `make build` builds
// them: runguard small and static.
var bins = testenv.NewBuilds("infra-e2e-bin-",
	testenv.Build{Name: "infra", Pkg: "."},
	testenv.Build{Name: "runguard", Pkg: "github.com/autoprovisioner/autoprovisioner/pkg/ansible/cmd/runguard", Static: true})

// TestMain removes the binaries the tests built: a test process leaves
// nothing behind in the temp dir (a clone's every run would add 50 MB).
func TestMain(m *testing.M) {
	code := m.Run()
	bins.Close()
	os.Exit(code)
}

// binaries builds infra and runguard (once) and returns the infra path.
func binaries(t testing.TB) string { return bins.Path(t, "infra") }

// repoPath returns an absolute path inside the repository.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// e2e is one test's world: its own Redis database, Postgres database,
// ansible directory, run root and SSH key.
type e2e struct {
	t          testing.TB
	redisURL   string
	rdb        *redis.Client
	dsn        string
	pool       *pgxpool.Pool
	ansibleDir string
	runRoot    string
	factCache  string
	sshKey     []byte // the client key every test sshd authorizes
	env        []string
}

func newE2E(t testing.TB, sshd *testenv.SSHD) *e2e {
	t.Helper()
	e := &e2e{t: t, redisURL: testenv.RedisDB(t), dsn: testenv.Postgres(t), runRoot: testenv.RunRoot(t)}
	opt, err := redis.ParseURL(e.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	e.rdb = redis.NewClient(opt)
	t.Cleanup(func() { e.rdb.Close() })
	e.pool, err = store.Open(context.Background(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	e.ansibleDir = e.makeAnsibleDir()
	e.factCache = filepath.Join(t.TempDir(), "facts")
	if sshd != nil {
		e.sshKey = sshd.ClientKey
	}
	return e
}

// makeAnsibleDir copies the test playbooks next to an ansible.cfg made from
// the project's own (same speed and safety settings, real callback plugin).
func (e *e2e) makeAnsibleDir() string {
	t := e.t
	// Readable to the sandbox's job users, as an operator's would be.
	dir, err := os.MkdirTemp("", "ansible-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"playbooks", "control", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	books, err := filepath.Glob("testdata/ansible/playbooks/*.yml")
	if err != nil || len(books) == 0 {
		t.Fatalf("test playbooks missing: %v", err)
	}
	for _, b := range books {
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "playbooks", filepath.Base(b)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := os.ReadFile(repoPath(t, "ansible/ansible.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	real := repoPath(t, "ansible")
	s := string(cfg)
	for _, key := range []string{"roles_path", "library", "callback_plugins"} {
		re := regexp.MustCompile(`(?m)^` + key + `\s*=\s*(\S+)\s*$`)
		s = re.ReplaceAllStringFunc(s, func(line string) string {
			v := re.FindStringSubmatch(line)[1]
			return key + " = " + filepath.Join(real, v)
		})
	}
	if err := os.WriteFile(filepath.Join(dir, "ansible.cfg"), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// infraProc is a running infra process and its admin address.
type infraProc struct {
	*testenv.Process
	admin string
}

// metrics returns the process's /metrics text.
func (p *infraProc) metrics(t testing.TB) string {
	return p.WaitHTTP("http://"+p.admin+"/metrics", 200, 10*time.Second)
}

// infra starts an infra process; extra overrides the defaults ("NAME=v").
func (e *e2e) infra(extra ...string) *infraProc {
	e.t.Helper()
	bin := binaries(e.t)
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(e.t))
	env := []string{
		"REDIS_URL=" + e.redisURL,
		"DATABASE_URL=" + e.dsn,
		"ADMIN_ADDR=" + admin,
		"LOG_FORMAT=json",
		"LOG_LEVEL=debug",
		"PLAYBOOK_DIR=" + e.ansibleDir,
		"PLAYBOOK_RUN_ROOT=" + e.runRoot,
		"PLAYBOOK_FACT_CACHE=" + e.factCache,
		// The test playbooks leave what they did in out/.
		"PLAYBOOK_SANDBOX_WRITABLE=" + filepath.Join(e.ansibleDir, "out"),
		"PLAYBOOK_KILL_GRACE=2s",
		"STREAM_LEASE=2s",
		"STREAM_RETRY_BACKOFF=200ms",
		"SHUTDOWN_GRACE=10s",
		"SSH_KEY_REF=env:AUTOPROV_SECRET_SSH_KEY",
		"AUTOPROV_SECRET_SSH_KEY=" + string(e.sshKey),
		"SSH_BASE_DELAY=200ms",
		"SSH_ATTEMPT_TIMEOUT=3s",
		"SSH_DEPLOY_USER=root",
		// The test servers are sshd on loopback: the operator lets them
		// through the special-address refusal (metadata never).
		"SPECIAL_ALLOW_NETWORKS=127.0.0.0/8",
	}
	env = append(env, e.env...)
	// INFRA_TEST_ENV (space-separated NAME=value) runs the tests with
	// extra settings, e.g. SSH_WARM_CONNECTIONS=true; a test's own win.
	env = append(env, strings.Fields(os.Getenv("INFRA_TEST_ENV"))...)
	env = append(env, extra...)
	p := testenv.StartBinary(e.t, bin, testenv.BinaryEnv(env...))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("infra logs:\n%s", p.Stderr())
		}
	})
	return &infraProc{Process: p, admin: admin}
}

// addServer registers a server reached through sshd.
func (e *e2e) addServer(handle string, sshd *testenv.SSHD) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(),
		`INSERT INTO servers (handle, address, ssh_port, ssh_user) VALUES ($1, $2, $3, $4)`,
		handle, sshd.Host, sshd.Port, sshd.User)
	if err != nil {
		e.t.Fatal(err)
	}
}

// control sets what the test playbooks do on host.
func (e *e2e) control(host string, ctl map[string]any) {
	e.t.Helper()
	data, _ := json.Marshal(ctl)
	if err := os.WriteFile(filepath.Join(e.ansibleDir, "control", host+".json"), data, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// publish appends a request and returns its entry id.
func (e *e2e) publish(streamName string, msg any) string {
	e.t.Helper()
	data, err := messages.Encode(msg)
	if err != nil {
		e.t.Fatal(err)
	}
	id, err := stream.NewProducer(e.rdb, stream.ProducerOptions{}).Publish(context.Background(), streamName, data)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// provision publishes a ProvisionerMessage with the given job id.
func (e *e2e) provision(jobID, handle string, mod ...func(*messages.ProvisionerMessage)) string {
	m := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerHandle: handle}
	for _, f := range mod {
		f(m)
	}
	return e.publish(messages.StreamProvisionerQueue, m)
}

// results returns every entry of a results stream, decoded generically.
func (e *e2e) results(streamName string) []redis.XMessage {
	e.t.Helper()
	msgs, err := e.rdb.XRange(context.Background(), streamName, "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

// provisionResults returns the provisioning results for jobID.
func (e *e2e) provisionResults(jobID string) []*messages.ProvisionerResult {
	var out []*messages.ProvisionerResult
	for _, m := range e.results(messages.StreamProvisionerResults) {
		r, err := messages.DecodeProvisionerResult([]byte(m.Values["data"].(string)))
		if err != nil {
			e.t.Fatalf("undecodable result %s: %v", m.ID, err)
		}
		if r.JobID == jobID {
			out = append(out, r)
		}
	}
	return out
}

// runStates is every run's job, state, status, attempt and owner, on one
// line (for a failure message).
func (e *e2e) runStates() string {
	var out string
	err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s %s/%s #%s by %s',
		job_id, state, coalesce(status, ''), attempt, coalesce(owner, '')), ', ' ORDER BY created_at), '') FROM runs`).Scan(&out)
	if err != nil {
		return err.Error()
	}
	return out
}

// pendingEntries is the group's pending entries of streamName (id,
// consumer, idle time, deliveries) on one line (for a failure message).
func (e *e2e) pendingEntries(streamName string) string {
	ps, err := e.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: streamName, Group: "infra", Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		return err.Error()
	}
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s on %s idle %s x%d", p.ID, p.Consumer, p.Idle.Round(time.Millisecond), p.RetryCount))
	}
	return fmt.Sprintf("%d [%s]", len(ps), strings.Join(out, ", "))
}

// waitProvision waits for the first result of jobID; running out of
// timeout names the runs and the queue's pending entries.
func (e *e2e) waitProvision(jobID string, timeout time.Duration) *messages.ProvisionerResult {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if rs := e.provisionResults(jobID); len(rs) > 0 {
			return rs[0]
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for the result of %s; runs: %s; pending: %s",
				timeout, jobID, e.runStates(), e.pendingEntries(messages.StreamProvisionerQueue))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitAcked waits until infra's group got every entry of streamName and
// acknowledged it: the consumer's own signal that a request is settled. An
// acknowledged entry is never delivered again, so what its handling left
// (results, runs) is final once this returns.
func (e *e2e) waitAcked(streamName string, timeout time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	testenv.WaitFor(e.t, timeout, "every "+streamName+" entry acknowledged", func() bool {
		info, err := e.rdb.XInfoStream(ctx, streamName).Result()
		if err != nil {
			return false
		}
		groups, err := e.rdb.XInfoGroups(ctx, streamName).Result()
		if err != nil {
			return false
		}
		for _, g := range groups {
			if g.Name == "infra" {
				return g.LastDeliveredID == info.LastGeneratedID && g.Pending == 0
			}
		}
		return false
	})
}

// deployResults returns the deploy results for jobID.
func (e *e2e) deployResults(jobID string) []*messages.AnsibleDeployResult {
	var out []*messages.AnsibleDeployResult
	for _, m := range e.results(messages.StreamDeployResults) {
		r, err := messages.DecodeAnsibleDeployResult([]byte(m.Values["data"].(string)))
		if err != nil {
			e.t.Fatalf("undecodable result %s: %v", m.ID, err)
		}
		if r.JobID == jobID {
			out = append(out, r)
		}
	}
	return out
}

func (e *e2e) server(handle string) *store.Server {
	e.t.Helper()
	s, err := store.GetServer(context.Background(), e.pool, handle)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *e2e) run(jobID string) *store.Run {
	e.t.Helper()
	r, err := store.GetRun(context.Background(), e.pool, jobID)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// span is one playbook run on a host, from the test playbooks' log.
type span struct {
	token      string
	playbook   string
	start, end float64 // end 0: never finished
}

// records returns the fields of the four-field lines of the test
// playbooks' record out/<name> on the targets (nil when there is none).
func (e *e2e) records(name string) [][]string {
	e.t.Helper()
	f, err := os.Open(filepath.Join(e.ansibleDir, "out", name))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) == 4 {
			out = append(out, fs)
		}
	}
	return out
}

// spans parses out/<host>.log.
func (e *e2e) spans(host string) []span {
	e.t.Helper()
	byToken := map[string]*span{}
	var order []string
	// "<start|end> <playbook> <token> <unix time>"
	for _, fs := range e.records(host + ".log") {
		ts, _ := strconv.ParseFloat(fs[3], 64)
		s := byToken[fs[2]]
		if s == nil {
			s = &span{token: fs[2], playbook: fs[1]}
			byToken[fs[2]] = s
			order = append(order, fs[2])
		}
		if fs[0] == "start" {
			s.start = ts
		} else if fs[0] == "end" {
			s.end = ts
		}
	}
	out := make([]span, 0, len(order))
	for _, k := range order {
		out = append(out, *byToken[k])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// assertNoOverlap fails when two runs on the host overlapped in time. A run
// that never finished (its process was killed) counts until the next start.
func assertNoOverlap(t *testing.T, spans []span) {
	t.Helper()
	for i := 1; i < len(spans); i++ {
		prev, cur := spans[i-1], spans[i]
		if prev.end != 0 && cur.start < prev.end {
			t.Errorf("runs overlap on one server: %+v and %+v", prev, cur)
		}
	}
}

// processesMentioning returns the pids whose command line contains s.
func processesMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// scanRows calls f with every row (as JSON) of the tables that could hold
// what a job handled: servers, runs, host_keys.
func (e *e2e) scanRows(f func(table, row string)) {
	e.t.Helper()
	for _, table := range []string{"servers", "runs", "host_keys"} {
		rows, err := e.pool.Query(context.Background(), `SELECT row_to_json(t)::text FROM `+table+` t`)
		if err != nil {
			e.t.Fatal(err)
		}
		for rows.Next() {
			var row string
			if err := rows.Scan(&row); err != nil {
				e.t.Fatal(err)
			}
			f(table, row)
		}
		rows.Close()
	}
}
