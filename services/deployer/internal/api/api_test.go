package api_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ro, roSecret, err := auth.NewStore(e.DB).Create(context.Background(), auth.NewKey{Name: "ro", Scopes: []auth.Scope{auth.ScopeServersRead}})
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedSecret, err := auth.NewStore(e.DB).Create(context.Background(), auth.NewKey{Name: "old", Scopes: []auth.Scope{auth.ScopeAdmin}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.NewStore(e.DB).Revoke(context.Background(), revoked.ID); err != nil {
		t.Fatal(err)
	}
	unknown := auth.NewSecret()
	tests := []struct {
		name, method, path, key string
		want                    int
		detail                  string
	}{
		{"no key", "GET", "/api/v1/deployments", "", 401, "Authorization: Bearer"},
		{"malformed key", "GET", "/api/v1/deployments", "not-a-key", 401, "not valid"},
		{"unknown key", "GET", "/api/v1/deployments", unknown, 401, "not valid"},
		{"revoked key", "GET", "/api/v1/deployments", revokedSecret, 401, "revoked"},
		{"wrong scope", "GET", "/api/v1/deployments", roSecret, 403, "deployments:read"},
		{"write implies read", "GET", "/api/v1/deployments", e.CI, 200, ""},
		{"admin only", "GET", "/api/v1/keys", e.CI, 403, "admin"},
		{"admin", "GET", "/api/v1/keys", e.Admin, 200, ""},
		{"servers scope", "GET", "/api/v1/servers", roSecret, 200, ""},
		{"servers scope is not deployments", "POST", "/api/v1/servers/x/pause", roSecret, 403, "servers:write"},
		{"openapi needs no key", "GET", "/api/v1/openapi.json", "", 200, ""},
		{"any key may ask who it is", "GET", "/api/v1/me", roSecret, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := e.Do(tt.method, tt.path, tt.key, nil)
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, body)
			}
			if tt.want >= 400 {
				p := dt.JSON[api.Problem](t, body)
				if !strings.Contains(p.Detail, tt.detail) || p.Status != tt.want || p.RequestID == "" {
					t.Errorf("problem %+v, want detail containing %q", p, tt.detail)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("content type %q", ct)
				}
			}
			if tt.want == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	_ = ro

	t.Run("revoking through the API takes effect at once", func(t *testing.T) {
		_, body := e.Do("POST", "/api/v1/keys", e.Admin, map[string]any{"name": "tmp", "scopes": []string{"deployments:read"}, "projects": []string{dt.Project}})
		created := dt.JSON[auth.CreatedKey](t, body)
		if !auth.WellFormed(created.Key) || !strings.HasPrefix(created.WebhookSecret, "whsec_") {
			t.Fatalf("created key %+v", created)
		}
		if resp, _ := e.Do("GET", "/api/v1/deployments", created.Key, nil); resp.StatusCode != 200 {
			t.Fatalf("new key: %d", resp.StatusCode)
		}
		if resp, body := e.Do("DELETE", "/api/v1/keys/"+created.ID, e.Admin, nil); resp.StatusCode != 200 {
			t.Fatalf("revoke: %d %s", resp.StatusCode, body)
		}
		if resp, _ := e.Do("GET", "/api/v1/deployments", created.Key, nil); resp.StatusCode != 401 {
			t.Fatalf("revoked key: %d, want 401", resp.StatusCode)
		}
		_, body = e.Do("GET", "/api/v1/keys", e.Admin, nil)
		if strings.Contains(string(body), created.Key) || !strings.Contains(string(body), `"last_used_at"`) {
			t.Errorf("key list shows the key or no last use: %s", body)
		}
		var stored int
		if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM api_keys WHERE hash::text LIKE '%'||$1||'%' OR prefix = $2`,
			created.Key, created.Key).Scan(&stored); err != nil || stored != 0 {
			t.Errorf("the key itself is stored (%d rows, %v)", stored, err)
		}
	})

	t.Run("the key never appears in the logs", func(t *testing.T) {
		for _, k := range []string{e.Admin, e.CI, roSecret, unknown, revokedSecret} {
			if strings.Contains(e.Logs.String(), k) {
				t.Fatalf("a key appears in the logs")
			}
		}
		if !strings.Contains(e.Logs.String(), `"key":"admin"`) || !strings.Contains(e.Logs.String(), `"request_id"`) {
			t.Errorf("request logs lack the key name or request id:\n%s", e.Logs.String())
		}
	})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"API_RATE_LIMIT": "2", "API_RATE_BURST": "3",
		"API_AUTH_FAILURE_RATE": "1"}})
	var limited *http.Response
	var limitedBody []byte
	for i := 0; i < 20 && limited == nil; i++ {
		resp, body := e.Do("GET", "/api/v1/deployments", e.CI, nil)
		checkRateHeaders(t, resp, 3)
		if resp.StatusCode == 429 {
			limited, limitedBody = resp, body
		}
	}
	if limited == nil {
		t.Fatal("20 requests at once with a limit of 2/s and burst 3 were never limited")
	}
	if limited.Header.Get("Retry-After") == "" || limited.Header.Get("RateLimit-Policy") != "3;w=2" {
		t.Errorf("429 headers: %v", limited.Header)
	}
	if p := dt.JSON[api.Problem](t, limitedBody); !strings.Contains(p.Detail, "rate limit of this API key is spent") {
		t.Errorf("a key's 429: %s", limitedBody)
	}
	// Another key has its own budget.
	if resp, _ := e.Do("GET", "/api/v1/keys", e.Admin, nil); resp.StatusCode != 200 {
		t.Errorf("another key was limited too: %d", resp.StatusCode)
	}

	// Failed authentications are limited per client address (1/s, burst
	// 2), and their 429 says so: no API key was valid, so none is spent.
	var failed []byte
	for i := 0; i < 10 && failed == nil; i++ {
		resp, body := e.Do("GET", "/api/v1/deployments", "apk_not-a-key-at-all", nil)
		checkRateHeaders(t, resp, 2)
		if resp.StatusCode == 429 {
			failed = body
		} else if resp.StatusCode != 401 {
			t.Fatalf("an unknown key: %d %s", resp.StatusCode, body)
		}
	}
	if failed == nil {
		t.Fatal("10 failed authentications at once with a limit of 1/s were never limited")
	}
	p := dt.JSON[api.Problem](t, failed)
	if strings.Contains(p.Detail, "API key is spent") || !strings.Contains(p.Detail, "from this address") ||
		!strings.Contains(p.Detail, "valid key") {
		t.Errorf("the auth-failure 429 says %q", p.Detail)
	}
}

// TestRateLimitHeadersAtDefaults: with the default limit (50/s, burst
// 100: budget handed out in leases) and a key's own rate (burst twice
// it), RateLimit-Limit is the burst and RateLimit-Remaining never exceeds
// it (it refills with time, so it need not only count down).
func TestRateLimitHeadersAtDefaults(t *testing.T) {
	// Not parallel: Remaining falls only while requests follow each other
	// within the limiter's lease (100ms), which tests beside it can stretch.
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"API_RATE_LIMIT": "50", "API_RATE_BURST": "100"}})
	// rate_limit 0 is refused: leaving it out means the default.
	resp, body := e.Do("POST", "/api/v1/keys", e.Admin, map[string]any{"name": "zero", "scopes": []string{"servers:read"}, "rate_limit": 0})
	if p := dt.JSON[api.Problem](t, body); resp.StatusCode != 422 || len(p.Errors) != 1 || p.Errors[0].Field != "rate_limit" ||
		!strings.Contains(p.Errors[0].Message, "leave rate_limit out") {
		t.Errorf("rate_limit 0: %d %s", resp.StatusCode, body)
	}
	_, body = e.Do("POST", "/api/v1/keys", e.Admin, map[string]any{"name": "own-rate", "scopes": []string{"servers:read"}, "rate_limit": 30})
	created := dt.JSON[auth.CreatedKey](t, body)
	own := created.Key
	if created.RateLimit != 30 || created.RateBurst != 60 || created.DefaultRate {
		t.Errorf("a key with its own rate: %s", body)
	}
	for _, k := range []struct {
		key          string
		burst, limit int
	}{{e.CI, 100, 50}, {own, 60, 30}} {
		least := k.burst
		for range 40 {
			resp, _ := e.Do("GET", "/api/v1/me", k.key, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			least = min(least, checkRateHeaders(t, resp, k.burst))
			if p := resp.Header.Get("RateLimit-Policy"); p != strconv.Itoa(k.burst)+";w=2" {
				t.Errorf("RateLimit-Policy %q for %d/s, burst %d", p, k.limit, k.burst)
			}
		}
		if least >= k.burst-1 {
			t.Errorf("40 requests never lowered RateLimit-Remaining below %d of %d", least, k.burst)
		}
	}
}

// checkRateHeaders checks a response's RateLimit headers: Limit is the
// burst, Remaining is at most Limit. It returns Remaining.
func checkRateHeaders(t *testing.T, resp *http.Response, burst int) int {
	t.Helper()
	limit, err1 := strconv.Atoi(resp.Header.Get("RateLimit-Limit"))
	rem, err2 := strconv.Atoi(resp.Header.Get("RateLimit-Remaining"))
	if err1 != nil || err2 != nil || limit != burst || rem < 0 || rem > limit {
		t.Fatalf("RateLimit-Limit %q, RateLimit-Remaining %q: want Limit %d (the burst) and 0 <= Remaining <= Limit",
			resp.Header.Get("RateLimit-Limit"), resp.Header.Get("RateLimit-Remaining"), burst)
	}
	return rem
}

func TestSubmitRejectsBadInput(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"API_MAX_BODY": "2048"}})
	token := "ghp_" + strings.Repeat("Zx9", 12) // a token pasted where a reference belongs
	with := func(k string, v any) map[string]any {
		r := dt.Request()
		r[k] = v
		return r
	}
	tests := []struct {
		name   string
		body   any
		hdr    []string
		status int
		field  string
	}{
		{"malformed JSON", `{"project_id": `, nil, 400, ""},
		{"not JSON", `project_id=1`, nil, 400, ""},
		{"empty body", ``, nil, 400, ""},
		{"two objects", `{} {}`, nil, 400, ""},
		{"array", `[]`, nil, 400, ""},
		{"unknown field", with("colour", "blue"), nil, 400, "colour"},
		{"wrong type", with("port", "22"), nil, 400, "port"},
		{"nested wrong type", with("options", map[string]any{"timeout_seconds": "1h"}), nil, 400, "options.timeout_seconds"},
		{"oversized", with("branch", strings.Repeat("a", 4000)), nil, 413, ""},
		{"wrong content type", `{}`, []string{"Content-Type", "text/plain"}, 415, ""},
		{"missing keys", `{}`, nil, 422, "project_id"},
		{"bad project id", with("project_id", "42"), nil, 422, "project_id"},
		{"bad address", with("server_ip", "10.0.0.1:22"), nil, 422, "server_ip"},
		{"bad branch", with("branch", "-rf"), nil, 422, "branch"},
		{"token pasted as a reference", with("github_token_ref", token), nil, 422, "github_token_ref"},
		{"token pasted as secrets_ref", with("secrets_ref", token), nil, 422, "secrets_ref"},
		{"vault ref is fine but port out of range", with("port", 70000), nil, 422, "port"},
		{"timeout too long", with("options", map[string]any{"timeout_seconds": 100000}), nil, 422, "options.timeout_seconds"},
		{"callback to loopback", with("options", map[string]any{"callback_url": "http://127.0.0.1:9/hook"}), nil, 422, "options.callback_url"},
		{"callback to metadata", with("options", map[string]any{"callback_url": "http://169.254.169.254/latest/meta-data/"}), nil, 422, "options.callback_url"},
		{"callback with credentials", with("options", map[string]any{"callback_url": "https://u:p@ci.example/hook"}), nil, 422, "options.callback_url"},
		{"callback not http", with("options", map[string]any{"callback_url": "file:///etc/passwd"}), nil, 422, "options.callback_url"},
		{"bad idempotency key", dt.Request(), []string{"Idempotency-Key", "has spaces in it"}, 400, "Idempotency-Key"},
		{"bad wait", dt.Request(), nil, 400, "wait"},
		{"unknown token-looking field is not echoed", map[string]any{token: 1}, nil, 400, ""},
		{"unknown nested field", with("options", map[string]any{"timeout_seconds": 60, "retries": 3}), nil, 400, "options.retries"},
		{"unknown nested field after a case-folded parent", `{"OPTIONS": {"retries": 3}}`, nil, 400, "options.retries"},
		{"unknown nested token-looking field is not echoed", with("options", map[string]any{token: 1}), nil, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := "/api/v1/deployments"
			if tt.name == "bad wait" {
				path += "?wait=forever"
			}
			resp, body := e.Do("POST", path, e.CI, tt.body, tt.hdr...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			p := dt.JSON[api.Problem](t, body)
			if tt.field != "" {
				found := false
				for _, f := range p.Errors {
					found = found || f.Field == tt.field
				}
				if !found {
					t.Errorf("no error names %q: %s", tt.field, body)
				}
			}
			if strings.Contains(string(body), token) || strings.Contains(string(body), "Zx9Zx9") {
				t.Errorf("the rejected value is echoed: %s", body)
			}
		})
	}
	if strings.Contains(e.Logs.String(), "Zx9Zx9") {
		t.Error("the pasted token reached the logs")
	}
	if n := e.QueueLen(); n != 0 {
		t.Errorf("%d requests were published for invalid input", n)
	}
}

func TestSubmitAndGet(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	req := dt.Request()
	req["project_id"] = "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F" // read case-insensitively, stored canonical
	req["server_ip"] = "2001:DB8:0::7"
	req["github_token_ref"] = "vault:secret/projects/9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f/ci#github_token" // DEPLOY_SECRET_REFS' default
	req["correlation_id"] = "pipeline-42"
	req["options"] = map[string]any{"timeout_seconds": 600}
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
	if resp.StatusCode != 202 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	d := dt.JSON[deployments.Deployment](t, body)
	if resp.Header.Get("Location") != d.Links.Self || d.Links.Events == "" || d.Links.Log == "" {
		t.Errorf("links: %+v, Location %q", d.Links, resp.Header.Get("Location"))
	}
	if d.Request.ProjectID != "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f" || d.Request.ServerIP != "2001:db8::7" {
		t.Errorf("not normalised by the wire rules: %+v", d.Request)
	}
	// The message on the queue is the wire contract's.
	entries, err := e.Redis.XRange(context.Background(), e.Streams.Queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %v %d", err, len(entries))
	}
	m, err := messages.DecodeAnsibleDeployMessage([]byte(entries[0].Values["data"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if m.JobID != d.JobID || m.TimeoutSeconds != 600 || m.CorrelationID != "pipeline-42" || m.GitHubTokenRef != req["github_token_ref"] {
		t.Errorf("published message %+v", m)
	}
	var final deployments.Deployment
	testenv.WaitFor(t, 30*time.Second, "the deployment to succeed", func() bool {
		_, body := e.Do("GET", d.Links.Self, e.CI, nil)
		final = dt.JSON[deployments.Deployment](t, body)
		return final.Status == deployments.StatusSucceeded
	})
	_, finalBody := e.Do("GET", d.Links.Self, e.CI, nil)
	dt.CheckSchema(t, "Deployment", finalBody)
	if final.Result == nil || final.Result.Hosts["srv-1"].Changed != 1 || final.StartedAt == nil || final.FinishedAt == nil {
		t.Errorf("final deployment: %+v", final)
	}
	if final.Progress == nil || final.Progress.CurrentPlay != "Deploy the project" || final.Progress.HostsChanged != 1 {
		t.Errorf("progress: %+v", final.Progress)
	}
	// progress.tasks counts task results per host, as the OpenAPI document says.
	if c := final.Progress.Tasks["srv-1"]; len(final.Progress.Tasks) != 1 || c == nil || c.Changed != 1 || c.OK+c.Failed+c.Unreachable+c.Skipped != 0 {
		t.Errorf("progress.tasks: %s", finalBody)
	}
	if final.RequestID != entries[0].ID {
		t.Errorf("request id %q, want the entry id %q", final.RequestID, entries[0].ID)
	}
	// The log.
	resp, body = e.Do("GET", d.Links.Log, e.CI, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "TASK [task 1]") || resp.Header.Get("Autoprov-Log") != "full" {
		t.Errorf("log: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp, _ := e.Do("GET", "/api/v1/deployments/00000000-0000-0000-0000-000000000000", e.CI, nil); resp.StatusCode != 404 {
		t.Errorf("unknown deployment: %d", resp.StatusCode)
	}
	if resp, _ := e.Do("GET", "/api/v1/deployments/not-a-uuid", e.CI, nil); resp.StatusCode != 404 {
		t.Errorf("malformed id: %d", resp.StatusCode)
	}
}

func TestIdempotencyUnderConcurrentRetries(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	const retries = 20
	ids := make([]string, retries)
	codes := make([]int, retries)
	var wg sync.WaitGroup
	for i := range retries {
		wg.Go(func() {
			resp, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request(), "Idempotency-Key", "build-1234")
			codes[i] = resp.StatusCode
			ids[i] = dt.JSON[deployments.Deployment](t, body).ID
		})
	}
	wg.Wait()
	for i := range retries {
		if codes[i] != 202 || ids[i] != ids[0] || ids[0] == "" {
			t.Fatalf("retry %d: %d %q, first %q", i, codes[i], ids[i], ids[0])
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the request on the queue", func() bool { return e.QueueLen() >= 1 })
	if n := e.QueueLen(); n != 1 {
		t.Errorf("%d requests published for one Idempotency-Key, want 1", n)
	}
	// A retry later still gets the first response; another body is refused.
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request(), "Idempotency-Key", "build-1234")
	if resp.StatusCode != 202 || resp.Header.Get("Idempotent-Replayed") != "true" || dt.JSON[deployments.Deployment](t, body).ID != ids[0] {
		t.Errorf("later retry: %d %s", resp.StatusCode, body)
	}
	other := dt.Request()
	other["branch"] = "release"
	resp, body = e.Do("POST", "/api/v1/deployments", e.CI, other, "Idempotency-Key", "build-1234")
	if resp.StatusCode != 422 || !strings.Contains(string(body), "idempotency-key-reused") {
		t.Errorf("same key, other body: %d %s", resp.StatusCode, body)
	}
	// Keys are per API key: the admin's "build-1234" is another request.
	resp, body = e.Do("POST", "/api/v1/deployments", e.Admin, dt.Request(), "Idempotency-Key", "build-1234")
	if resp.StatusCode != 202 || dt.JSON[deployments.Deployment](t, body).ID == ids[0] {
		t.Errorf("another API key's idempotency key: %d %s", resp.StatusCode, body)
	}
}

// TestRequestIDInFirstAnswer: the first 202 carries request_id (the
// queue entry the request was published as), with an Idempotency-Key and
// without, and every replay of the key shows the same one at once.
func TestRequestIDInFirstAnswer(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	entryOf := func(jobID string) string {
		entries, err := e.Redis.XRange(context.Background(), e.Streams.Queue, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			if m, err := messages.DecodeAnsibleDeployMessage([]byte(en.Values["data"].(string))); err == nil && m.JobID == jobID {
				return en.ID
			}
		}
		return ""
	}
	for _, key := range []string{"build-77", ""} {
		var hdr []string
		if key != "" {
			hdr = []string{"Idempotency-Key", key}
		}
		req := dt.Request()
		req["correlation_id"] = "first-answer-" + key
		resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req, hdr...)
		first := dt.JSON[deployments.Deployment](t, body)
		if resp.StatusCode != 202 || first.RequestID == "" || first.RequestID != entryOf(first.JobID) {
			t.Fatalf("key %q: first answer %d, request_id %q, want the queue entry %q: %s", key, resp.StatusCode,
				first.RequestID, entryOf(first.JobID), body)
		}
		dt.CheckSchema(t, "Deployment", body)
		if key == "" {
			continue
		}
		for i := range 3 {
			resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req, hdr...)
			replay := dt.JSON[deployments.Deployment](t, body)
			if resp.Header.Get("Idempotent-Replayed") != "true" || replay.ID != first.ID || replay.RequestID != first.RequestID {
				t.Errorf("replay %d: id %s request_id %q, first %s %q", i+1, replay.ID, replay.RequestID, first.ID, first.RequestID)
			}
		}
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	e := dt.Start(t, dt.Options{PlanFor: func(m *messages.AnsibleDeployMessage) fakeinfra.Plan {
		if m.Branch == "slow" {
			return fakeinfra.Plan{Tasks: 1, Hold: hold}
		}
		return fakeinfra.Plan{Tasks: 3}
	}})
	defer close(hold)

	t.Run("ends", func(t *testing.T) {
		resp, body := e.Do("POST", "/api/v1/deployments?wait=60s", e.CI, dt.Request())
		d := dt.JSON[deployments.Deployment](t, body)
		if resp.StatusCode != 200 || d.Status != deployments.StatusSucceeded || d.Result == nil {
			t.Fatalf("sync submit: %d %s", resp.StatusCode, body)
		}
	})
	t.Run("times out", func(t *testing.T) {
		req := dt.Request()
		req["branch"] = "slow"
		start := time.Now()
		resp, body := e.Do("POST", "/api/v1/deployments?wait=1500ms", e.CI, req)
		d := dt.JSON[deployments.Deployment](t, body)
		if resp.StatusCode != 202 || d.Status.Terminal() {
			t.Fatalf("sync submit that runs out: %d %s", resp.StatusCode, body)
		}
		if took := time.Since(start); took < 1500*time.Millisecond {
			t.Errorf("answered after %v, before the wait ran out", took)
		}
		// GET ?wait= too.
		resp, _ = e.Do("GET", d.Links.Self+"?wait=200ms", e.CI, nil)
		if resp.StatusCode != 202 {
			t.Errorf("GET ?wait= on a running deployment: %d", resp.StatusCode)
		}
	})
}

func TestCancel(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	e := dt.Start(t, dt.Options{NoInfra: true, PlanFor: func(m *messages.AnsibleDeployMessage) fakeinfra.Plan {
		if m.Branch == "hold" {
			return fakeinfra.Plan{Tasks: 1, Hold: hold}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})

	// Queued: infra is not running yet.
	_, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request())
	queued := dt.JSON[deployments.Deployment](t, body)
	resp, body := e.Do("DELETE", queued.Links.Self, e.CI, nil)
	d := dt.JSON[deployments.Deployment](t, body)
	if resp.StatusCode != 200 || d.Status != deployments.StatusCancelled || d.Result == nil || d.Result.Error.Kind != "cancelled" {
		t.Fatalf("cancel queued: %d %s", resp.StatusCode, body)
	}
	e.StartInfra()
	req := dt.Request()
	req["branch"] = "hold"
	_, body = e.Do("POST", "/api/v1/deployments", e.CI, req)
	running := dt.JSON[deployments.Deployment](t, body)
	testenv.WaitFor(t, 30*time.Second, "the held deployment to run", func() bool {
		_, body := e.Do("GET", running.Links.Self, e.CI, nil)
		return dt.JSON[deployments.Deployment](t, body).Status == deployments.StatusRunning
	})
	// The cancelled one was read by infra, which published its stored
	// result without running it (infra takes both requests at once, so the
	// held one may run before that result is out: wait for it).
	testenv.WaitFor(t, 30*time.Second, "infra to publish the cancelled result of the queued deployment", func() bool {
		results, _ := e.Redis.XRange(context.Background(), e.Streams.Results, "-", "+").Result()
		for _, r := range results {
			res, err := messages.DecodeAnsibleDeployResult([]byte(r.Values["data"].(string)))
			if err == nil && res.JobID == queued.JobID && res.Status == messages.StatusCancelled {
				return true
			}
		}
		return false
	})
	if n := e.Infra.Started(queued.JobID); n != 0 {
		t.Errorf("the cancelled queued deployment ran %d times", n)
	}

	resp, body = e.Do("DELETE", running.Links.Self, e.CI, nil)
	d = dt.JSON[deployments.Deployment](t, body)
	if resp.StatusCode != 202 || d.CancelRequestedAt == nil {
		t.Fatalf("cancel running: %d %s", resp.StatusCode, body)
	}
	if n, _ := e.Redis.Exists(context.Background(), messages.CancelKey(messages.JobKindDeploy, running.JobID)).Result(); n != 1 {
		t.Error("the cancel key is not set")
	}
	resp, body = e.Do("GET", running.Links.Self+"?wait=30s", e.CI, nil)
	if d := dt.JSON[deployments.Deployment](t, body); resp.StatusCode != 200 || d.Status != deployments.StatusCancelled {
		t.Fatalf("running deployment after cancel: %d %s", resp.StatusCode, body)
	}
	resp, body = e.Do("DELETE", running.Links.Self, e.CI, nil)
	if p := dt.JSON[api.Problem](t, body); resp.StatusCode != 409 || p.DeploymentStatus != "cancelled" {
		t.Errorf("cancel finished: %d %s", resp.StatusCode, body)
	}
	if resp, _ := e.Do("DELETE", "/api/v1/deployments/00000000-0000-0000-0000-000000000000", e.CI, nil); resp.StatusCode != 404 {
		t.Errorf("cancel unknown: %d", resp.StatusCode)
	}
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	const n = 25
	var ids []string
	for i := range n {
		req := dt.Request()
		if i%5 == 0 {
			req["project_id"] = "11111111-2222-3333-4444-555555555555"
		}
		_, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
		ids = append(ids, dt.JSON[deployments.Deployment](t, body).ID)
	}
	var got []string
	path := "/api/v1/deployments?limit=10"
	pages := 0
	for path != "" {
		resp, body := e.Do("GET", path, e.CI, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("list: %d %s", resp.StatusCode, body)
		}
		page := dt.JSON[api.DeploymentList](t, body)
		for _, d := range page.Items {
			got = append(got, d.ID)
		}
		path = page.Links.Next
		pages++
	}
	if pages != 3 || len(got) != n {
		t.Fatalf("%d pages, %d items", pages, len(got))
	}
	for i := range n { // newest first
		if got[i] != ids[n-1-i] {
			t.Fatalf("item %d is %s, want %s", i, got[i], ids[n-1-i])
		}
	}
	_, body := e.Do("GET", "/api/v1/deployments?project_id=11111111-2222-3333-4444-555555555555&status=queued", e.CI, nil)
	if page := dt.JSON[api.DeploymentList](t, body); len(page.Items) != 5 {
		t.Errorf("filter by project: %d items", len(page.Items))
	}
	_, body = e.Do("GET", "/api/v1/deployments?status=succeeded", e.CI, nil)
	if page := dt.JSON[api.DeploymentList](t, body); len(page.Items) != 0 {
		t.Errorf("filter by status: %d items", len(page.Items))
	}
	since := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	_, body = e.Do("GET", "/api/v1/deployments?since="+since, e.CI, nil)
	if page := dt.JSON[api.DeploymentList](t, body); len(page.Items) != 0 {
		t.Errorf("filter by time: %d items", len(page.Items))
	}
	for _, q := range []string{"limit=0", "limit=101", "cursor=garbage", "status=done", "project_id=x", "since=yesterday", "server=%20", "colour=red"} {
		resp, body := e.Do("GET", "/api/v1/deployments?"+q, e.CI, nil)
		if resp.StatusCode != 400 {
			t.Errorf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
}

func TestForeignDeployments(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	m := &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "agent-job-7"},
		ProjectID:   "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.9", Port: 80,
	}
	data, err := messages.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Redis.XAdd(context.Background(), &redis.XAddArgs{Stream: e.Streams.Queue, Values: map[string]any{"data": data}}).Err(); err != nil {
		t.Fatal(err)
	}
	var page api.DeploymentList
	// Its result may come before the observer reads the request (infra is
	// quicker than the observer's batches): the request's fields follow.
	testenv.WaitFor(t, 30*time.Second, "the other producer's deployment to finish, with its request", func() bool {
		_, body := e.Do("GET", "/api/v1/deployments?job_id=agent-job-7", e.CI, nil)
		page = dt.JSON[api.DeploymentList](t, body)
		return len(page.Items) == 1 && page.Items[0].Status == deployments.StatusSucceeded && page.Items[0].Request.RepoFullName != ""
	})
	d := page.Items[0]
	if d.Source != "stream" || d.Request.RepoFullName != "acme/shop" || d.RequestID == "" {
		t.Errorf("foreign deployment: %+v", d)
	}
	if resp, body := e.Do("GET", "/api/v1/deployments/agent-job-7", e.CI, nil); resp.StatusCode != 200 || dt.JSON[deployments.Deployment](t, body).ID != d.ID {
		t.Errorf("GET by job id: %d %s", resp.StatusCode, body)
	}
	_, body := e.Do("GET", "/api/v1/deployments?source=stream", e.CI, nil)
	if p := dt.JSON[api.DeploymentList](t, body); len(p.Items) != 1 {
		t.Errorf("source filter: %d", len(p.Items))
	}
}
