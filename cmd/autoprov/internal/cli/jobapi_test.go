package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestJobCommands: `autoprov job run|status|cancel|follow` against the
// real deployer binary: the job is published on ansible:job:queue, shows
// queued, is cancelled before it starts, and follow ends with its status
// (exit 1). Without an API key the commands are usage errors.
func TestJobCommands(t *testing.T) {
	t.Parallel()
	api, key, rdb := deployerWithKey(t, "jobs:write")
	const project = testProject
	file := filepath.Join(t.TempDir(), "job.json")
	body := `{"project_id":"` + project + `","source":{"type":"playbook","repository":"https://git.example.com/org/pb.git","paths":["site.yml"]},
		"inventory":{"type":"inline","hosts":["198.51.100.7"]}}`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"AUTOPROV_API_URL": "http://" + api, "AUTOPROV_API_KEY": key}

	if _, stderr, code := run(t, map[string]string{"AUTOPROV_API_URL": "http://" + api}, "job", "status", "x"); code != ExitUsage || !strings.Contains(stderr, "AUTOPROV_API_KEY") {
		t.Errorf("without a key: %d %s", code, stderr)
	}
	stdout, stderr, code := run(t, env, "--json", "job", "run", file, "--idempotency-key", "ci-1")
	var j struct{ ID, Status string }
	if code != 0 || json.Unmarshal([]byte(stdout), &j) != nil || j.Status != "queued" {
		t.Fatalf("job run: %d %s %s", code, stdout, stderr)
	}
	if n, _ := rdb.XLen(context.Background(), messages.StreamAnsibleJobQueue).Result(); n != 1 {
		t.Errorf("%d entries on %s", n, messages.StreamAnsibleJobQueue)
	}
	if stdout, stderr, code = run(t, env, "job", "status", j.ID); code != 0 || !strings.Contains(stdout, "job "+j.ID+": queued") ||
		!strings.Contains(stdout, "pending 1") {
		t.Errorf("job status: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code = run(t, env, "job", "cancel", j.ID); code != 0 || !strings.Contains(stdout, ": cancelled") {
		t.Errorf("job cancel: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code = run(t, env, "job", "follow", j.ID, "--timeout", "30s"); code != ExitFailed || !strings.Contains(stdout, "run finished: cancelled") {
		t.Errorf("job follow: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code = run(t, env, "job", "status", "01a20000-0000-7000-8000-000000000000"); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
		t.Errorf("unknown job: %d %s", code, stderr)
	}
}

// TestJobLaunchAndRelaunch: `autoprov job launch` submits a template's job
// with survey answers typed by the survey (a number for an integer
// question, a list for multi_choice), `job relaunch` runs a finished job
// again.
func TestJobLaunchAndRelaunch(t *testing.T) {
	t.Parallel()
	api, key, rdb := deployerWithKey(t, "templates:write,templates:launch,jobs:write")
	client := &apiClient{base: "http://" + api, key: key, http: &http.Client{}}
	var tpl struct{ ID string }
	_, err := client.do(context.Background(), http.MethodPost, "/api/v1/templates", []byte(`{"name":"site",
		"job":{"source":{"type":"playbook","repository":"https://git.example.com/org/pb.git","paths":["site.yml"]},
			"inventory":{"type":"inline","hosts":["198.51.100.7"]}},
		"survey":[{"variable":"release","type":"text"},{"variable":"replicas","type":"integer"},
			{"variable":"features","type":"multi_choice","choices":["a","b"]}]}`), nil, &tpl)
	if err != nil || tpl.ID == "" {
		t.Fatalf("create the template: %v", err)
	}
	env := map[string]string{"AUTOPROV_API_URL": "http://" + api, "AUTOPROV_API_KEY": key}

	stdout, stderr, code := run(t, env, "--json", "job", "launch", tpl.ID, "--set", "release=1.2;rc1", "--set", "replicas=3",
		"--set", "features=a,b", "--idempotency-key", "l-1")
	var j struct{ ID, Status string }
	if code != 0 || json.Unmarshal([]byte(stdout), &j) != nil || j.Status != "queued" {
		t.Fatalf("job launch: %d %s %s", code, stdout, stderr)
	}
	_, m := queuedJob(t, rdb)
	if x := m.Options.ExtraVars; x["release"] != "1.2;rc1" || x["replicas"] != int64(3) || fmt.Sprint(x["features"]) != "[a b]" {
		t.Errorf("extra vars %v", x)
	}
	if _, stderr, code := run(t, env, "job", "launch", tpl.ID, "--set", "replicas=many"); code != ExitUsage || !strings.Contains(stderr, "whole number") {
		t.Errorf("a word for an integer: %d %s", code, stderr)
	}
	if _, stderr, code := run(t, env, "job", "launch", tpl.ID, "--set", "nope=1"); code != ExitFailed || !strings.Contains(stderr, "survey.nope") {
		t.Errorf("an answer to no question: %d %s", code, stderr)
	}

	if _, stderr, code := run(t, env, "job", "relaunch", j.ID); code != ExitFailed || !strings.Contains(stderr, "HTTP 409") {
		t.Errorf("relaunch of a queued job: %d %s", code, stderr)
	}
	if stdout, stderr, code := run(t, env, "job", "cancel", j.ID); code != 0 || !strings.Contains(stdout, ": cancelled") {
		t.Fatalf("job cancel: %d %s %s", code, stdout, stderr)
	}
	stdout, stderr, code = run(t, env, "--json", "job", "relaunch", j.ID)
	var again struct{ ID, Status string }
	if code != 0 || json.Unmarshal([]byte(stdout), &again) != nil || again.Status != "queued" || again.ID == j.ID {
		t.Errorf("job relaunch: %d %s %s", code, stdout, stderr)
	}
	if n, _ := rdb.XLen(context.Background(), messages.StreamAnsibleJobQueue).Result(); n != 2 {
		t.Errorf("%d entries on the job queue, want 2", n)
	}
}

// testProject is the project of the tests' API keys.
const testProject = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"

// deployerWithKey starts the deployer binary on a Redis database and a
// Postgres database of the test's own and returns its API address, a key
// with scopes for the test project, and the Redis client.
func deployerWithKey(t *testing.T, scopes string) (string, string, *redis.Client) {
	t.Helper()
	d := startDeployer(t)
	return d.api, d.key(t, scopes, testProject), d.rdb
}

// testDeployer is a deployer binary of a test's own.
type testDeployer struct {
	api  string // the API's address
	rdb  *redis.Client
	env  []string // its settings, for `deployer keys`
	bin  string
	keys int // how many keys were made
}

// startDeployer starts the deployer binary on a Redis database and a
// Postgres database of the test's own, with a webhook signing key (for
// triggers' secrets).
func startDeployer(t *testing.T) *testDeployer {
	t.Helper()
	bin := serviceBinaries(t)
	url, rdb := redisDB(t)
	pg := testenv.Postgres(t)
	api, admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := []string{"REDIS_URL=" + url, "DATABASE_URL=" + pg, "WEBHOOK_SIGNING_KEY=cli-test-webhook-signing-key-0123456789abcdef"}
	dep := testenv.StartBinary(t, filepath.Join(bin, "deployer"), testenv.BinaryEnv(
		append([]string{"API_ADDR=" + api, "ADMIN_ADDR=" + admin, "LOG_FORMAT=json"}, env...)...))
	dep.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("deployer logs:\n%s", dep.Stderr())
		}
	})
	return &testDeployer{api: api, rdb: rdb, env: env, bin: bin}
}

// key creates an API key with scopes (comma-separated) for project.
func (d *testDeployer) key(t *testing.T, scopes, project string) string {
	t.Helper()
	d.keys++
	cmd := exec.Command(filepath.Join(d.bin, "deployer"), "keys", "create", "--name", fmt.Sprintf("ci-%d", d.keys), "--scopes", scopes,
		"--project", project, "--json")
	cmd.Env = testenv.BinaryEnv(d.env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("keys create: %v %s", err, stderr.String())
	}
	var created struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(out, &created); err != nil || created.Key == "" {
		t.Fatalf("keys create: %v %s", err, out)
	}
	return created.Key
}

// cliEnv is the settings of autoprov talking to d with key.
func (d *testDeployer) cliEnv(key string) map[string]string {
	return map[string]string{"AUTOPROV_API_URL": "http://" + d.api, "AUTOPROV_API_KEY": key}
}
