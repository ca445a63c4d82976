package api_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// outageRequest is a request sent while Postgres is away, with the key of
// its role ("ci": a project's pipeline, "admin": an operator).
type outageRequest struct {
	role, method, path string
	body               any
	hdr                []string
}

// With Postgres out of reach, every submit (a deployment, an Ansible job,
// a server's provisioning), every other write and the reads answer 503
// with a Retry-After of whole seconds, never 500: for keys the cache lets
// past authentication, and for keys it does not know (their check needs
// Postgres). Once Postgres is back, a submit retried with its
// Idempotency-Key is stored once.
func TestPostgresOutageAnswers503(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, proxy := dt.ProxiedPool(t)
	keys := auth.NewStore(pool)
	newKey := func(name string, scopes []auth.Scope, projects ...string) (string, string) {
		k, secret, err := keys.Create(ctx, auth.NewKey{Name: name, Scopes: scopes, Projects: projects})
		if err != nil {
			t.Fatal(err)
		}
		return k.ID, secret
	}
	ciScopes := []auth.Scope{auth.ScopeDeploymentsWrite, auth.ScopeJobsWrite, auth.ScopeCredentialsWrite}
	_, ci := newKey("ci", ciScopes, dt.Project)
	_, admin := newKey("admin", []auth.Scope{auth.ScopeAdmin})
	// Keys never used before the outage: the cache does not know them.
	_, ciUncached := newKey("ci-uncached", ciScopes, dt.Project)
	_, adminUncached := newKey("admin-uncached", []auth.Scope{auth.ScopeAdmin})
	spareID, _ := newKey("spare", []auth.Scope{auth.ScopeDeploymentsRead}, dt.Project)
	e := dt.Start(t, dt.Options{DB: pool, NoInfra: true, Env: map[string]string{"API_KEY_CACHE_TTL": "10m"}})

	// Before the outage: the cached keys are used (and so cached), and
	// there are a deployment and a job to read and cancel.
	submitted := func(path string, body any) string {
		resp, data := e.Do("POST", path, ci, body)
		if resp.StatusCode != 202 {
			t.Fatalf("POST %s before the outage: %d %s", path, resp.StatusCode, data)
		}
		return dt.JSON[struct{ ID string }](t, data).ID
	}
	dep, job := submitted("/api/v1/deployments", dt.Request()), submitted("/api/v1/jobs", jobRequest())
	if resp, body := e.Do("GET", "/api/v1/keys", admin, nil); resp.StatusCode != 200 {
		t.Fatalf("admin key before the outage: %d %s", resp.StatusCode, body)
	}
	var stored int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&stored); err != nil {
		t.Fatal(err)
	}

	ref := "vault:secret/projects/" + dt.Project + "/ssh#private_key"
	deployIdem, jobIdem := []string{"Idempotency-Key", "outage-deploy"}, []string{"Idempotency-Key", "outage-job"}
	requests := []outageRequest{
		// Submits and other writes.
		{"ci", "POST", "/api/v1/deployments", dt.Request(), deployIdem},
		{"ci", "POST", "/api/v1/jobs", jobRequest(), jobIdem},
		{"ci", "DELETE", "/api/v1/deployments/" + dep, nil, nil},
		{"ci", "DELETE", "/api/v1/jobs/" + job, nil, nil},
		{"ci", "POST", "/api/v1/credentials", map[string]any{"name": "prod-ssh", "ref": ref}, nil},
		{"ci", "DELETE", "/api/v1/credentials/prod-ssh?project_id=" + dt.Project, nil, nil},
		{"admin", "POST", "/api/v1/servers/web-1/provision", map[string]any{"reason": "outage test"}, nil},
		{"admin", "POST", "/api/v1/servers/web-1/rebuild", nil, nil},
		{"admin", "POST", "/api/v1/servers/web-1/pause", nil, nil},
		{"admin", "PUT", "/api/v1/servers/web-1/projects", map[string]any{"projects": []string{dt.Project}}, nil},
		{"admin", "POST", "/api/v1/keys", map[string]any{"name": "new", "scopes": []string{"deployments:read"},
			"projects": []string{dt.Project}}, nil},
		{"admin", "DELETE", "/api/v1/keys/" + spareID, nil, nil},
		// Reads.
		{"ci", "GET", "/api/v1/deployments?project_id=" + dt.Project, nil, nil},
		{"ci", "GET", "/api/v1/deployments/" + dep, nil, nil},
		{"ci", "GET", "/api/v1/deployments/" + dep + "/events", nil, nil},
		{"ci", "GET", "/api/v1/jobs", nil, nil},
		{"ci", "GET", "/api/v1/jobs/" + job, nil, nil},
		{"ci", "GET", "/api/v1/jobs/" + job + "/logs", nil, nil},
		{"ci", "GET", "/api/v1/credentials?project_id=" + dt.Project, nil, nil},
		{"admin", "GET", "/api/v1/servers", nil, nil},
		{"admin", "GET", "/api/v1/servers/web-1", nil, nil},
		{"admin", "GET", "/api/v1/keys", nil, nil},
	}

	proxy.Cut()
	for _, keyed := range []struct {
		name string
		keys map[string]string
	}{
		{"cached key", map[string]string{"ci": ci, "admin": admin}},
		{"uncached key", map[string]string{"ci": ciUncached, "admin": adminUncached}},
	} {
		for _, req := range requests {
			resp, body := e.Do(req.method, req.path, keyed.keys[req.role], req.body, req.hdr...)
			what := req.method + " " + req.path + " with Postgres away (" + keyed.name + ")"
			assertRetryLater(t, what, resp, body)
		}
	}

	proxy.Restore()
	for _, s := range []struct {
		path string
		body any
		idem []string
	}{{"/api/v1/deployments", dt.Request(), deployIdem}, {"/api/v1/jobs", jobRequest(), jobIdem}} {
		var first string
		testenv.WaitFor(t, 30*time.Second, "POST "+s.path+" to work again", func() bool {
			resp, body := e.Do("POST", s.path, ci, s.body, s.idem...)
			if resp.StatusCode != 202 {
				assertRetryLater(t, "POST "+s.path+" while Postgres comes back", resp, body)
				return false
			}
			first = dt.JSON[struct{ ID string }](t, body).ID
			return true
		})
		resp, body := e.Do("POST", s.path, ci, s.body, s.idem...)
		if resp.StatusCode != 202 || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("POST %s again: %d replayed=%q %s", s.path, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
		}
		if again := dt.JSON[struct{ ID string }](t, body).ID; again != first {
			t.Errorf("POST %s again: id %s, first was %s", s.path, again, first)
		}
	}
	var now int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now != stored+2 {
		t.Errorf("%d rows after the outage's two submits, want %d: a submit retried after the outage is stored once", now, stored+2)
	}
}

// assertRetryLater checks that resp (with body) is a 503 problem with a
// Retry-After of a positive number of seconds, and never a 500.
func assertRetryLater(t *testing.T, what string, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != 503 {
		t.Errorf("%s: %d, want 503: %s", what, resp.StatusCode, body)
		return
	}
	if p := dt.JSON[api.Problem](t, body); p.Type == "" || p.Status != 503 {
		t.Errorf("%s: problem %+v", what, p)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Errorf("%s: 503 without Retry-After", what)
	} else if n, err := strconv.Atoi(ra); err != nil || n <= 0 {
		t.Errorf("%s: Retry-After %q, want a positive number of seconds", what, ra)
	}
}

// With Redis out of reach (Postgres up), a deployment's progress stream,
// which reads its events from Redis, answers 503 with a Retry-After, and
// streams again once Redis is back.
func TestRedisOutageEventsAnswer503(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(testenv.RedisDB(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	opt.Addr = proxy.Addr
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	e := dt.Start(t, dt.Options{Redis: rdb, NoInfra: true, Env: map[string]string{"API_KEY_CACHE_TTL": "10m"}})
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request())
	if resp.StatusCode != 202 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	events := "/api/v1/deployments/" + dt.JSON[struct{ ID string }](t, body).ID + "/events"

	proxy.Cut()
	resp, body = e.Do("GET", events, e.CI, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("GET %s with Redis away: %d, want 503: %s", events, resp.StatusCode, body)
	}
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || n <= 0 {
		t.Errorf("GET %s with Redis away: Retry-After %q, want a positive number of seconds", events, resp.Header.Get("Retry-After"))
	}

	proxy.Restore()
	testenv.WaitFor(t, 30*time.Second, "the stream to open again", func() bool {
		s := e.OpenSSE(t, events, e.CI, "")
		defer s.Close()
		return s.Resp.StatusCode == 200
	})
}
