package api_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// With Postgres out of reach, requests whose key is cached get past
// authentication; a submit (or a read) then answers 503 with Retry-After,
// never 500, and works again once Postgres is back.
func TestPostgresOutageAnswers503(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	pool, err := store.Open(context.Background(), proxy.URL(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, key, err := auth.NewStore(pool).Create(context.Background(), auth.NewKey{Name: "ci",
		Scopes: []auth.Scope{auth.ScopeDeploymentsWrite}, Projects: []string{dt.Project}})
	if err != nil {
		t.Fatal(err)
	}
	e := dt.Start(t, dt.Options{DB: pool, NoInfra: true, Env: map[string]string{"API_KEY_CACHE_TTL": "10m"}})
	if resp, body := e.Do("GET", "/api/v1/deployments?project_id="+dt.Project, key, nil); resp.StatusCode != 200 {
		t.Fatalf("before the outage: %d %s", resp.StatusCode, body)
	}

	proxy.Cut()
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/v1/deployments", dt.Request()},
		{"GET", "/api/v1/deployments?project_id=" + dt.Project, nil},
	} {
		resp, body := e.Do(req.method, req.path, key, req.body)
		if resp.StatusCode != 503 {
			t.Fatalf("%s %s with Postgres away: %d, want 503: %s", req.method, req.path, resp.StatusCode, body)
		}
		if p := dt.JSON[api.Problem](t, body); p.Type == "" || p.Status != 503 {
			t.Errorf("%s %s: problem %+v", req.method, req.path, p)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", req.method, req.path)
		}
	}

	proxy.Restore()
	testenv.WaitFor(t, 30*time.Second, "submits to work again", func() bool {
		resp, _ := e.Do("POST", "/api/v1/deployments", key, dt.Request())
		return resp.StatusCode == 202
	})
}
