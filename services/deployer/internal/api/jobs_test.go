package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

const jobSigningKey = "test-request-signing-key-0123456789abcdef"

// jobRequest is a valid job of dt.Project on two inline hosts.
func jobRequest() map[string]any {
	return map[string]any{
		"project_id": dt.Project,
		"source": map[string]any{"type": "playbook", "repository": "https://git.example.com/org/playbooks.git",
			"ref": "v1.0.0", "paths": []string{"site.yml"}},
		"inventory": map[string]any{"type": "inline", "hosts": map[string]any{
			"web-1": map[string]any{"ansible_host": "198.51.100.7"}, "web-2": map[string]any{"ansible_host": "198.51.100.8"}}},
		"options": map[string]any{"extra_vars": map[string]any{"http_port": 8080, "ratio": 0.5}, "tags": []string{"deploy"}},
	}
}

// TestJobs: a job is submitted with a credential's name (published as its
// reference, signed, on the job queue, without the callback URL), an
// Idempotency-Key replays it, ?wait= sees its end, its result (from
// job:results) shows in GET, list, the log and the signed job.finished
// webhook; the stream replays its events and resumes after Last-Event-ID.
func TestJobs(t *testing.T) {
	t.Parallel()
	recv := newReceiver(t)
	e := dt.Start(t, dt.Options{Env: map[string]string{"WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
		"REQUEST_SIGNING_KEY_ID": "deployer-test", "REQUEST_SIGNING_KEY": jobSigningKey}})
	ctx := context.Background()
	key := e.Key("jobs-a", []auth.Scope{auth.ScopeJobsWrite, auth.ScopeCredentialsWrite}, dt.Project)
	var keyID string
	if err := e.DB.QueryRow(ctx, `SELECT id::text FROM api_keys WHERE name = 'jobs-a'`).Scan(&keyID); err != nil {
		t.Fatal(err)
	}
	sshRef := "vault:secret/projects/" + dt.Project + "/ssh#private_key"
	if resp, body := e.Do("POST", "/api/v1/credentials", key, map[string]any{"name": "prod-ssh", "ref": sshRef}); resp.StatusCode != 201 {
		t.Fatalf("credential: %d %s", resp.StatusCode, body)
	}
	req := jobRequest()
	req["credentials"] = map[string]any{"ssh": "prod-ssh", "become_password": "vault:secret/projects/" + dt.Project + "/sudo#password"}
	req["options"].(map[string]any)["callback_url"] = recv.srv.URL + "/hooks/job?token=receiver-secret-456"
	resp, body := e.Do("POST", "/api/v1/jobs?wait=30s", key, req, "Idempotency-Key", "job-1")
	if resp.StatusCode != 200 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Job", body)
	j := dt.JSON[api.Job](t, body)
	if j.Kind != "job" || j.Status != "succeeded" || j.Progress.HostsChanged != 2 || j.Progress.HostsPending == nil || *j.Progress.HostsPending != 0 {
		t.Errorf("job after wait: %s", body)
	}
	if strings.Contains(string(body), "receiver-secret-456") {
		t.Error("the callback URL's query is shown")
	}
	if j.Result == nil || len(j.Result.Playbooks) != 1 || j.Result.Commit == "" {
		t.Errorf("result without playbooks or commit: %s", body)
	}

	t.Run("the request on the queue", func(t *testing.T) {
		entries, err := e.Redis.XRange(ctx, e.Streams.JobQueue, "-", "+").Result()
		if err != nil || len(entries) != 1 {
			t.Fatalf("%d entries on the job queue (%v)", len(entries), err)
		}
		data, _ := entries[0].Values[messages.DataField].(string)
		sig, _ := entries[0].Values[messages.SigField].(string)
		v, err := messages.NewVerifier(messages.VerifierKey{ID: "deployer-test", Key: []byte(jobSigningKey), Streams: []string{e.Streams.JobQueue}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(e.Streams.JobQueue, []byte(data), sig); err != nil {
			t.Errorf("signature: %v", err)
		}
		m, err := messages.DecodeAnsibleJobMessage([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if m.JobID != j.ID || m.Credentials.SSH != sshRef || m.Options.CallbackURL != "" || strings.Contains(data, "receiver-secret") {
			t.Errorf("published %+v", m)
		}
		if p, ok := m.Options.ExtraVars["http_port"].(int64); !ok || p != 8080 {
			t.Errorf("extra_vars.http_port is %T %v, want the integer 8080", m.Options.ExtraVars["http_port"], m.Options.ExtraVars["http_port"])
		}
	})
	t.Run("idempotency", func(t *testing.T) {
		resp, body := e.Do("POST", "/api/v1/jobs", key, req, "Idempotency-Key", "job-1")
		if resp.StatusCode != 202 || resp.Header.Get("Idempotent-Replayed") != "true" || dt.JSON[api.Job](t, body).ID != j.ID {
			t.Errorf("replay: %d %s", resp.StatusCode, body)
		}
		other := jobRequest()
		resp, _ = e.Do("POST", "/api/v1/jobs", key, other, "Idempotency-Key", "job-1")
		if resp.StatusCode != 422 {
			t.Errorf("the key with another body: %d", resp.StatusCode)
		}
		if n, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); n != 1 {
			t.Errorf("%d requests published", n)
		}
	})
	t.Run("get, list, logs", func(t *testing.T) {
		resp, body := e.Do("GET", "/api/v1/jobs/"+j.ID, key, nil)
		if resp.StatusCode != 200 || dt.JSON[api.Job](t, body).Status != "succeeded" {
			t.Errorf("get: %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("GET", "/api/v1/jobs?status=succeeded", key, nil)
		list := dt.JSON[api.JobList](t, body)
		if resp.StatusCode != 200 || len(list.Items) != 1 || list.Items[0].ID != j.ID {
			t.Errorf("list: %d %s", resp.StatusCode, body)
		}
		dt.CheckSchema(t, "JobList", body)
		resp, body = e.Do("GET", "/api/v1/jobs/"+j.ID+"/logs", key, nil)
		if resp.StatusCode != 200 || !strings.Contains(string(body), "changed: [web-2]") {
			t.Errorf("logs: %d %s", resp.StatusCode, body)
		}
		// A job is no deployment in the deployments' list.
		_, body = e.Do("GET", "/api/v1/deployments", e.Admin, nil)
		if strings.Contains(string(body), j.ID) {
			t.Error("the job is listed as a deployment")
		}
	})
	t.Run("stream", func(t *testing.T) {
		all := e.OpenSSE(t, "/api/v1/jobs/"+j.ID+"/stream", key, "").All()
		if len(all) < 4 || all[len(all)-1].Event != "run_finished" {
			t.Fatalf("events: %+v", all)
		}
		rest := e.OpenSSE(t, "/api/v1/jobs/"+j.ID+"/stream", key, all[1].ID).All()
		if len(rest) != len(all)-2 || rest[0].ID != all[2].ID {
			t.Errorf("resumed after %s: %d events, want %d", all[1].ID, len(rest), len(all)-2)
		}
	})
	t.Run("webhook", func(t *testing.T) {
		testenv.WaitFor(t, 30*time.Second, "the webhook", func() bool { return recv.count() >= 1 })
		recv.mu.Lock()
		r, b := recv.got[0], recv.bodies[0]
		recv.mu.Unlock()
		if r.Header.Get(hmacsig.HeaderEvent) != webhooks.EventJobFinished || !strings.Contains(string(b), j.ID) {
			t.Errorf("webhook %s: %s", r.Header.Get(hmacsig.HeaderEvent), b)
		}
		secret := webhooks.DeriveSecret([]byte(dt.SigningKey), keyID)
		if err := hmacsig.Verify(secret, r.Header.Get(hmacsig.HeaderSignature), b, time.Hour, time.Now()); err != nil {
			t.Errorf("webhook signature: %v", err)
		}
	})
}

// TestJobRefusals: invalid jobs are 422 naming the fields (an unknown
// credential name, another project's credential, a reference outside the
// project's templates, wire rule breaks), a project the key lacks is 403;
// nothing is stored or published. A pool belongs to the operator: one not
// granted to the project (JOB_POOL_PROJECTS) is 422 options.pool.
func TestJobRefusals(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"JOB_POOL_PROJECTS": "gpu=*,tenant-b=" + projectB}})
	keyA := e.Key("jobs-a", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	keyB := e.Key("jobs-b", []auth.Scope{auth.ScopeJobsWrite, auth.ScopeCredentialsWrite}, projectB)
	if resp, body := e.Do("POST", "/api/v1/credentials", keyB, map[string]any{"name": "b-ssh", "ref": "vault:secret/projects/" + projectB + "/ssh"}); resp.StatusCode != 201 {
		t.Fatalf("B's credential: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct {
		name   string
		change func(m map[string]any)
		status int
		fields []string
	}{
		{"unknown credential", func(m map[string]any) { m["credentials"] = map[string]any{"ssh": "nope"} }, 422, []string{"credentials.ssh"}},
		{"another project's credential", func(m map[string]any) { m["credentials"] = map[string]any{"ssh": "b-ssh"} }, 422, []string{"credentials.ssh"}},
		{"reference of another project", func(m map[string]any) {
			m["source"].(map[string]any)["git_credential"] = "vault:secret/projects/" + projectB + "/git"
		}, 422, []string{"source.git_credential"}},
		{"wire rules", func(m map[string]any) {
			m["source"].(map[string]any)["paths"] = []string{"../escape.yml"}
			m["options"].(map[string]any)["verbosity"] = 9
			m["options"].(map[string]any)["timeout"] = -1
		}, 422, []string{"source.paths[0]", "options.verbosity", "options.timeout"}},
		{"another project", func(m map[string]any) { m["project_id"] = projectB }, 403, []string{"project_id"}},
		{"another project's pool", func(m map[string]any) { m["options"].(map[string]any)["pool"] = "tenant-b" }, 422, []string{"options.pool"}},
		{"a pool granted to nobody", func(m map[string]any) { m["options"].(map[string]any)["pool"] = "trusted" }, 422, []string{"options.pool"}},
		{"default is no pool's name", func(m map[string]any) { m["options"].(map[string]any)["pool"] = "default" }, 422, []string{"options.pool"}},
		{"none is no pool's name", func(m map[string]any) { m["options"].(map[string]any)["pool"] = "none" }, 422, []string{"options.pool"}},
		// Literal special addresses: refused at submit, naming the host.
		{"special addresses", func(m map[string]any) {
			m["inventory"] = map[string]any{"type": "inline", "hosts": map[string]any{
				"lo":        map[string]any{"ansible_host": "127.0.0.1"},
				"metadata":  map[string]any{"ansible_host": "169.254.169.254"},
				"localhost": map[string]any{},
				"octal":     map[string]any{"ansible_host": "0177.0.0.1"},
				"ok":        map[string]any{"ansible_host": "198.51.100.9"},
				"named":     map[string]any{"ansible_host": "web.example.com"},
			}}
		}, 422, []string{"inventory.hosts[lo][ansible_host]", "inventory.hosts[localhost]",
			"inventory.hosts[metadata][ansible_host]", "inventory.hosts[octal][ansible_host]"}},
	} {
		req := jobRequest()
		tc.change(req)
		resp, body := e.Do("POST", "/api/v1/jobs", keyA, req)
		p := dt.JSON[api.Problem](t, body)
		var got []string
		for _, f := range p.Errors {
			got = append(got, f.Field)
		}
		if resp.StatusCode != tc.status || strings.Join(got, ",") != strings.Join(tc.fields, ",") {
			t.Errorf("%s: %d %s, want %d naming %v", tc.name, resp.StatusCode, body, tc.status, tc.fields)
		}
	}
	if n, _ := e.Redis.XLen(context.Background(), e.Streams.JobQueue).Result(); n != 0 {
		t.Errorf("%d refused jobs published", n)
	}
	var n int
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM deployments`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d refused jobs stored (%v)", n, err)
	}
	// The pools granted: to every project, and to B alone.
	for _, tc := range []struct {
		key, project, pool string
	}{{keyA, dt.Project, "gpu"}, {keyB, projectB, "tenant-b"}} {
		req := jobRequest()
		req["project_id"] = tc.project
		req["options"].(map[string]any)["pool"] = tc.pool
		if tc.project == projectB {
			req["credentials"] = map[string]any{"ssh": "b-ssh"}
			req["source"].(map[string]any)["git_credential"] = "vault:secret/projects/" + projectB + "/git"
		}
		resp, body := e.Do("POST", "/api/v1/jobs", tc.key, req)
		if resp.StatusCode != 202 {
			t.Errorf("pool %s for its project: %d %s, want 202", tc.pool, resp.StatusCode, body)
			continue
		}
		if n, _ := e.Redis.XLen(context.Background(), e.Streams.JobQueue+":"+tc.pool).Result(); n != 1 {
			t.Errorf("pool %s: %d jobs on its stream, want 1", tc.pool, n)
		}
	}
}

// TestJobTenancyAndCancel: another project's job answers as an unknown id
// on every route; a key without the jobs scopes cannot see jobs; a
// deployment answers on /jobs/{id}; a running job is cancelled.
func TestJobTenancyAndCancel(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	e := dt.Start(t, dt.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		return fakeinfra.Plan{Tasks: 1, Hold: hold}
	}})
	keyA := e.Key("jobs-a", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	keyB := e.Key("jobs-b", []auth.Scope{auth.ScopeJobsWrite}, projectB)
	resp, body := e.Do("POST", "/api/v1/jobs", keyA, jobRequest())
	if resp.StatusCode != 202 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	j := dt.JSON[api.Job](t, body)
	const unknown = "01a20000-0000-7000-8000-000000000000"
	for _, route := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "?wait=1s"}, {"GET", "/stream"}, {"GET", "/logs"}, {"DELETE", ""},
	} {
		resp, body := e.Do(route.method, "/api/v1/jobs/"+j.ID+route.suffix, keyB, nil)
		uresp, ubody := e.Do(route.method, "/api/v1/jobs/"+unknown+route.suffix, keyB, nil)
		if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, body) != problemShape(t, ubody) {
			t.Errorf("%s %s: %d for A's job, %d for an unknown one", route.method, route.suffix, resp.StatusCode, uresp.StatusCode)
		}
	}
	// The refusal names what the route asked for.
	if _, body := e.Do("GET", "/api/v1/jobs/"+unknown, keyB, nil); !strings.Contains(string(body), "no job has this id") {
		t.Errorf("an unknown job: %s", body)
	}
	if _, body := e.Do("GET", "/api/v1/jobs", keyB, nil); strings.Contains(string(body), j.ID) {
		t.Error("B lists A's job")
	}
	// The deployments' scopes do not reach jobs, nor the jobs' deployments.
	if resp, _ := e.Do("GET", "/api/v1/jobs", e.CI, nil); resp.StatusCode != 403 {
		t.Errorf("a deployments key lists jobs: %d", resp.StatusCode)
	}
	if resp, _ := e.Do("GET", "/api/v1/deployments/"+j.ID, e.CI, nil); resp.StatusCode != 404 {
		t.Errorf("a deployments key reads a job: %d", resp.StatusCode)
	}
	resp, body = e.Do("POST", "/api/v1/deployments?wait=30s", e.CI, dt.Request())
	if resp.StatusCode != 200 {
		t.Fatalf("deployment: %d %s", resp.StatusCode, body)
	}
	dep := dt.JSON[api.Job](t, body)
	resp, body = e.Do("GET", "/api/v1/jobs/"+dep.ID, e.CI, nil)
	if resp.StatusCode != 200 || dt.JSON[api.Job](t, body).Kind != "deploy" {
		t.Errorf("a deployment on /jobs/{id}: %d %s", resp.StatusCode, body)
	}
	if resp, _ := e.Do("GET", "/api/v1/jobs/"+dep.ID, keyA, nil); resp.StatusCode != 404 {
		t.Errorf("a jobs key reads a deployment: %d", resp.StatusCode)
	}

	testenv.WaitFor(t, 30*time.Second, "the job running", func() bool {
		_, body := e.Do("GET", "/api/v1/jobs/"+j.ID, keyA, nil)
		return dt.JSON[api.Job](t, body).Status == "running"
	})
	resp, body = e.Do("DELETE", "/api/v1/jobs/"+j.ID, keyA, nil)
	if resp.StatusCode != 202 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	if n, _ := e.Redis.Exists(context.Background(), messages.CancelKey(messages.JobKindJob, j.ID)).Result(); n != 1 {
		t.Error("no cancel key on job:job:<id>:cancel")
	}
	resp, body = e.Do("GET", "/api/v1/jobs/"+j.ID+"?wait=30s", keyA, nil)
	if resp.StatusCode != 200 || dt.JSON[api.Job](t, body).Status != "cancelled" {
		t.Errorf("after cancel: %d %s", resp.StatusCode, body)
	}
}

// TestPythonJobClient runs docs/examples/ansible_job.py (standard library
// only) against the deployer: it submits, follows the stream to the end
// and exits 0 for a job that succeeded; a refused job exits 2.
func TestPythonJobClient(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	key := e.Key("ci-py", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	dir := t.TempDir()
	good, _ := json.Marshal(jobRequest())
	bad := jobRequest()
	bad["project_id"] = projectB
	refused, _ := json.Marshal(bad)
	for _, tc := range []struct {
		name string
		body []byte
		code int
		want string
	}{
		{"succeeds", good, 0, "run finished: succeeded"},
		{"refused", refused, 2, "job refused: HTTP 403"},
	} {
		file := filepath.Join(dir, tc.name+".json")
		if err := os.WriteFile(file, tc.body, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/usr/bin/python3", filepath.Join("..", "..", "..", "..", "docs", "examples", "ansible_job.py"), file,
			"--idempotency-key", "py-"+tc.name, "--timeout", "60")
		cmd.Env = []string{"AUTOPROV_API_URL=" + e.URL, "AUTOPROV_API_KEY=" + key, "PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: exit %d, output:\n%s", tc.name, code, out)
		}
	}
}

// submitGPUJob submits jobRequest on pool gpu with query (a ?wait=) and
// returns the answer, which must have status want.
func submitGPUJob(t *testing.T, e *dt.Env, query string, want int) []byte {
	t.Helper()
	key := e.Key(testenv.Unique("jobs-gpu-"), []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	req := jobRequest()
	req["options"].(map[string]any)["pool"] = "gpu"
	resp, body := e.Do("POST", "/api/v1/jobs"+query, key, req)
	if resp.StatusCode != want {
		t.Fatalf("submit: %d %s, want %d", resp.StatusCode, body, want)
	}
	return body
}

// TestPooledJobResultEchoesPool: a job on a pool granted to its project
// runs from the pool's stream, and its result says which pool ran it.
func TestPooledJobResultEchoesPool(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"JOB_POOL_PROJECTS": "gpu=" + dt.Project}})
	e.Infra.JobQueue = e.Streams.JobQueue + ":gpu" // a replica of pool gpu alone
	e.StartInfra()
	body := submitGPUJob(t, e, "?wait=30s", 200)
	dt.CheckSchema(t, "Job", body)
	j := dt.JSON[api.Job](t, body)
	if j.Status != "succeeded" || j.Result == nil || j.Result.Pool != "gpu" {
		t.Errorf("the result of a job of pool gpu: %s", body)
	}
}

// TestJobWaitingForNoReplica: a queued job whose pool no infra replica
// reads says so; once a replica reads the pool's queue, it does not; while
// it waits in the lines of busy hosts, it says where it stands.
func TestJobWaitingForNoReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"JOB_POOL_PROJECTS": "gpu=" + dt.Project}})
	key := e.Key("jobs-wait", []auth.Scope{auth.ScopeJobsRead}, dt.Project)
	id := dt.JSON[api.Job](t, submitGPUJob(t, e, "", 202)).ID
	_, body := e.Do("GET", "/api/v1/jobs/"+id, key, nil)
	dt.CheckSchema(t, "Job", body)
	if j := dt.JSON[api.Job](t, body); !strings.Contains(j.Waiting, "no infra replica serves pool gpu") {
		t.Errorf("a job of a pool nobody serves: waiting %q", j.Waiting)
	}
	// A replica of pool gpu appears (its consumer just read the queue).
	queue := e.Streams.JobQueue + ":gpu"
	if err := e.Redis.XGroupCreate(ctx, queue, "infra", "$").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.Redis.XGroupCreateConsumer(ctx, queue, "infra", "infra-1").Err(); err != nil {
		t.Fatal(err)
	}
	_, body = e.Do("GET", "/api/v1/jobs/"+id, key, nil)
	if j := dt.JSON[api.Job](t, body); j.Waiting != "" || j.Status != "queued" {
		t.Errorf("a queued job with a live replica: status %s, waiting %q", j.Status, j.Waiting)
	}

	// Infra found its hosts busy: it waits in their lines (as infra's
	// store.JoinLines puts it), behind a job that came first on one, and
	// a run holds the other.
	locker := store.NewLocker(e.DB, 0)
	holder, err := locker.Acquire(ctx, "running-"+id, "server:busy-1", store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := store.JoinLines(ctx, e.DB, store.Waiter{Job: "first-" + id}, []string{"server:free-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.JoinLines(ctx, e.DB, store.Waiter{Job: id}, []string{"server:busy-1", "server:free-1"}); err != nil {
		t.Fatal(err)
	}
	_, body = e.Do("GET", "/api/v1/jobs/"+id, key, nil)
	dt.CheckSchema(t, "Job", body)
	j := dt.JSON[api.Job](t, body)
	if j.Queue == nil || j.Queue.Position != 2 || len(j.Queue.Hosts) != 2 ||
		!j.Queue.Hosts[0].Busy || j.Queue.Hosts[0].Ahead != 0 || j.Queue.Hosts[1].Busy || j.Queue.Hosts[1].Ahead != 1 {
		t.Errorf("a job waiting for a busy host behind another job: queue %s", body)
	}
	if !strings.Contains(j.Waiting, "server:busy-1 (busy, 0 ahead)") || !strings.Contains(j.Waiting, "server:free-1 (free, reserved for runs ahead, 1 ahead)") {
		t.Errorf("waiting %q, want the hosts' lines", j.Waiting)
	}
}
