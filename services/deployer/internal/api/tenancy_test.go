package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// projectB is the other tenant of the tenancy tests.
const projectB = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"

// problemShape is a problem without what differs between two requests
// (the path and the request id): two 404s with equal shapes tell a client
// nothing apart.
func problemShape(t *testing.T, body []byte) string {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem %s: %v", body, err)
	}
	delete(p, "instance")
	delete(p, "request_id")
	b, _ := json.Marshal(p)
	return string(b)
}

// TestTenantIsolation: a key of project A cannot submit for project B (403,
// nothing stored or published), cannot see B's deployments through any
// route (404 exactly as an unknown id: get, wait, events, log, webhooks,
// cancel), lists only A's (the filter is in the query: pages stay full),
// and its Idempotency-Keys never find B's deployments.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	write := []auth.Scope{auth.ScopeDeploymentsWrite}
	keyA, keyB := e.Key("tenant-a", write, dt.Project), e.Key("tenant-b", write, projectB)
	ctx := context.Background()

	reqB := dt.Request()
	reqB["project_id"] = projectB
	reqB["secrets_ref"] = "vault:secret/projects/" + projectB + "/env"
	resp, body := e.Do("POST", "/api/v1/deployments?wait=30s", keyB, reqB)
	if resp.StatusCode != 200 {
		t.Fatalf("B's deployment: %d %s", resp.StatusCode, body)
	}
	dB := dt.JSON[deployments.Deployment](t, body)
	var aIDs []string
	for range 3 {
		resp, body := e.Do("POST", "/api/v1/deployments", keyA, dt.Request())
		if resp.StatusCode != 202 {
			t.Fatalf("A's deployment: %d %s", resp.StatusCode, body)
		}
		aIDs = append(aIDs, dt.JSON[deployments.Deployment](t, body).ID)
	}
	count := func() (n int) {
		if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.WaitFor(t, 10*time.Second, "A's requests on the queue", func() bool { return e.QueueLen() == 4 })
	stored, queued := count(), e.QueueLen()

	t.Run("submit for another project", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			project string
			hdr     []string
		}{
			{"B's project", projectB, nil},
			{"B's project in capitals", strings.ToUpper(projectB), nil},
			{"with an Idempotency-Key", projectB, []string{"Idempotency-Key", "attack-1"}},
			{"a project no key has", "22222222-3333-4444-5555-666666666666", nil},
		} {
			req := dt.Request()
			req["project_id"] = tc.project
			req["secrets_ref"] = "vault:secret/projects/" + projectB + "/env"
			resp, body := e.Do("POST", "/api/v1/deployments", keyA, req, tc.hdr...)
			p := dt.JSON[api.Problem](t, body)
			if resp.StatusCode != 403 || len(p.Errors) != 1 || p.Errors[0].Field != "project_id" {
				t.Errorf("%s: %d %s, want 403 naming project_id", tc.name, resp.StatusCode, body)
			}
			dt.CheckSchema(t, "Problem", body)
		}
		if n := count(); n != stored {
			t.Errorf("%d deployments stored by refused requests", n-stored)
		}
		if n := e.QueueLen(); n != queued {
			t.Errorf("%d requests published by refused requests", n-queued)
		}
	})

	t.Run("B's deployment answers as an unknown one", func(t *testing.T) {
		const unknown = "01a20000-0000-7000-8000-000000000000"
		for _, route := range []struct{ method, suffix string }{
			{"GET", ""}, {"GET", "?wait=1s"}, {"GET", "/events"}, {"GET", "/log"}, {"GET", "/webhooks"}, {"DELETE", ""},
		} {
			resp, body := e.Do(route.method, "/api/v1/deployments/"+dB.ID+route.suffix, keyA, nil)
			uresp, ubody := e.Do(route.method, "/api/v1/deployments/"+unknown+route.suffix, keyA, nil)
			if resp.StatusCode != 404 || uresp.StatusCode != 404 {
				t.Errorf("%s %s: %d for B's id, %d for an unknown one; want 404 both", route.method, route.suffix, resp.StatusCode, uresp.StatusCode)
				continue
			}
			if got, want := problemShape(t, body), problemShape(t, ubody); got != want {
				t.Errorf("%s %s: B's id answers %s, an unknown id %s", route.method, route.suffix, got, want)
			}
			if strings.Contains(string(body), projectB) {
				t.Errorf("%s %s: the answer names B's project: %s", route.method, route.suffix, body)
			}
		}
		// By its job id too.
		if resp, _ := e.Do("GET", "/api/v1/deployments/"+dB.JobID, keyA, nil); resp.StatusCode != 404 {
			t.Errorf("B's job id: %d", resp.StatusCode)
		}
		// B's cancel of A's deployment changes nothing.
		if resp, _ := e.Do("DELETE", "/api/v1/deployments/"+aIDs[0], keyB, nil); resp.StatusCode != 404 {
			t.Errorf("B cancels A's deployment: %d", resp.StatusCode)
		}
		_, body := e.Do("GET", "/api/v1/deployments/"+aIDs[0], keyA, nil)
		if d := dt.JSON[deployments.Deployment](t, body); d.CancelRequestedAt != nil || d.Status == deployments.StatusCancelled {
			t.Errorf("A's deployment after B's cancel: %s", body)
		}
		// B itself still sees all of it.
		for _, suffix := range []string{"", "/events", "/log", "/webhooks"} {
			if resp, body := e.Do("GET", "/api/v1/deployments/"+dB.ID+suffix, keyB, nil); resp.StatusCode != 200 {
				t.Errorf("B reads its own %q: %d %s", suffix, resp.StatusCode, body)
			}
		}
	})

	t.Run("lists hold only the key's projects", func(t *testing.T) {
		ids := func(key, query string) []string {
			var out []string
			for path := "/api/v1/deployments?" + query; path != ""; {
				resp, body := e.Do("GET", path, key, nil)
				if resp.StatusCode != 200 {
					t.Fatalf("list %s: %d %s", query, resp.StatusCode, body)
				}
				page := dt.JSON[api.DeploymentList](t, body)
				for _, d := range page.Items {
					out = append(out, d.ID)
				}
				path = page.Links.Next
			}
			slices.Sort(out)
			return out
		}
		wantA := slices.Sorted(slices.Values(aIDs))
		if got := ids(keyA, ""); !slices.Equal(got, wantA) {
			t.Errorf("A's list: %v, want %v", got, wantA)
		}
		// One item a page: B's deployment, the newest of all but A's, must
		// not leave an empty page or a short count behind.
		resp, body := e.Do("GET", "/api/v1/deployments?limit=3", keyA, nil)
		if page := dt.JSON[api.DeploymentList](t, body); resp.StatusCode != 200 || len(page.Items) != 3 || page.NextCursor != "" {
			t.Errorf("A's page of 3: %d items, next %q", len(page.Items), page.NextCursor)
		}
		for _, q := range []string{"project_id=" + projectB, "job_id=" + dB.JobID, "source=stream"} {
			if got := ids(keyA, q); len(got) != 0 {
				t.Errorf("A's list ?%s: %v, want none (and no error: no oracle)", q, got)
			}
		}
		if got := ids(keyB, ""); !slices.Equal(got, []string{dB.ID}) {
			t.Errorf("B's list: %v", got)
		}
		if got := ids(e.Admin, ""); len(got) != 4 {
			t.Errorf("the fleet-wide admin key lists %d deployments, want 4", len(got))
		}
	})

	t.Run("Idempotency-Keys stay within their key", func(t *testing.T) {
		resp, body := e.Do("POST", "/api/v1/deployments", keyB, reqB, "Idempotency-Key", "release-7")
		first := dt.JSON[deployments.Deployment](t, body)
		if resp.StatusCode != 202 {
			t.Fatalf("B: %d %s", resp.StatusCode, body)
		}
		// A replays B's request with B's Idempotency-Key: refused, and
		// never B's deployment.
		resp, body = e.Do("POST", "/api/v1/deployments", keyA, reqB, "Idempotency-Key", "release-7")
		if resp.StatusCode != 403 || strings.Contains(string(body), first.ID) {
			t.Errorf("A replays B's request: %d %s", resp.StatusCode, body)
		}
		// A's own request with the same Idempotency-Key is a new one.
		resp, body = e.Do("POST", "/api/v1/deployments", keyA, dt.Request(), "Idempotency-Key", "release-7")
		if d := dt.JSON[deployments.Deployment](t, body); resp.StatusCode != 202 || d.ID == first.ID ||
			resp.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("A's request with B's Idempotency-Key: %d %s", resp.StatusCode, body)
		}
	})
}

// TestSubmitChecksSecretRefs: a reference outside the project's templates
// (DEPLOY_SECRET_REFS, infra's syntax) is refused at submit with 422 naming
// the field, and never stored or published.
func TestSubmitChecksSecretRefs(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{
		"DEPLOY_SECRET_REFS": "vault:secret/projects/{project_id}/**,env:AUTOPROV_PROJECT_{PROJECT_ID}_*",
	}})
	envA := "AUTOPROV_PROJECT_" + strings.ToUpper(strings.ReplaceAll(dt.Project, "-", "_"))
	envB := "AUTOPROV_PROJECT_" + strings.ToUpper(strings.ReplaceAll(projectB, "-", "_"))
	tests := []struct {
		name, field, ref string
		ok               bool
	}{
		{"own vault path", "secrets_ref", "vault:secret/projects/" + dt.Project + "/env", true},
		{"own vault path with a field", "github_token_ref", "vault:secret/projects/" + dt.Project + "/gh#token", true},
		{"own variable", "github_token_ref", "env:" + envA + "_GH", true},
		{"B's vault path", "secrets_ref", "vault:secret/projects/" + projectB + "/env", false},
		{"B's variable", "github_token_ref", "env:" + envB + "_GH", false},
		{"the service's SSH key", "secrets_ref", "vault:secret/infra/ssh#private_key", false},
		{"a file", "secrets_ref", "file:projects/" + dt.Project + "/env", false},
		{"escape by ..", "secrets_ref", "vault:secret/projects/" + dt.Project + "/../" + projectB + "/env", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.QueueLen()
			req := dt.Request()
			req[tt.field] = tt.ref
			resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
			if tt.ok {
				if resp.StatusCode != 202 {
					t.Fatalf("%d %s", resp.StatusCode, body)
				}
				return
			}
			p := dt.JSON[api.Problem](t, body)
			if resp.StatusCode != 422 || len(p.Errors) != 1 || p.Errors[0].Field != tt.field {
				t.Fatalf("%d %s, want 422 naming %s", resp.StatusCode, body, tt.field)
			}
			var n int
			if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM deployments
				WHERE secrets_ref = $1 OR github_token_ref = $1`, tt.ref).Scan(&n); err != nil || n != 0 {
				t.Errorf("stored: %d rows, %v", n, err)
			}
			if e.QueueLen() != before {
				t.Error("published")
			}
		})
	}
}

// TestKeyProjects: keys are created bound to projects (canonical ids) or
// fleet-wide by the rules of auth.Binding, through the admin API; /me
// shows the binding.
func TestKeyProjects(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	tests := []struct {
		name      string
		body      map[string]any
		status    int
		projects  []string
		fleetWide bool
	}{
		{"bound", map[string]any{"scopes": []string{"deployments:write"}, "projects": []string{strings.ToUpper(dt.Project), projectB, dt.Project}},
			201, []string{projectB, dt.Project}, false},
		{"explicitly fleet-wide", map[string]any{"scopes": []string{"deployments:read"}, "fleet_wide": true}, 201, []string{}, true},
		{"admin is fleet-wide", map[string]any{"scopes": []string{"admin"}}, 201, []string{}, true},
		{"servers keys are fleet-wide", map[string]any{"scopes": []string{"servers:write"}}, 201, []string{}, true},
		{"deployments without projects", map[string]any{"scopes": []string{"deployments:read"}}, 422, nil, false},
		{"a project that is no project id", map[string]any{"scopes": []string{"deployments:read"}, "projects": []string{"acme"}}, 422, nil, false},
		{"admin bound to a project", map[string]any{"scopes": []string{"admin"}, "projects": []string{dt.Project}}, 422, nil, false},
		{"servers bound to a project", map[string]any{"scopes": []string{"deployments:write", "servers:read"}, "projects": []string{dt.Project}}, 422, nil, false},
		{"both", map[string]any{"scopes": []string{"deployments:read"}, "projects": []string{dt.Project}, "fleet_wide": true}, 422, nil, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.body["name"] = "k" + string(rune('a'+i))
			resp, body := e.Do("POST", "/api/v1/keys", e.Admin, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tt.status)
			}
			if tt.status != 201 {
				p := dt.JSON[api.Problem](t, body)
				if len(p.Errors) != 1 || p.Errors[0].Field != "projects" || strings.Contains(string(body), "acme") {
					t.Errorf("problem %s, want one naming projects (not echoing the value)", body)
				}
				return
			}
			created := dt.JSON[auth.CreatedKey](t, body)
			dt.CheckSchema(t, "CreatedKey", body)
			_, me := e.Do("GET", "/api/v1/me", created.Key, nil)
			dt.CheckSchema(t, "Key", me)
			for _, v := range []auth.KeyView{created.KeyView, dt.JSON[auth.KeyView](t, me)} {
				if !slices.Equal(v.Projects, tt.projects) || v.FleetWide != tt.fleetWide || v.LegacyFleetWide {
					t.Errorf("key %+v, want projects %v, fleet-wide %v", v, tt.projects, tt.fleetWide)
				}
			}
		})
	}
	// A bound key works for its projects at once.
	_, body := e.Do("POST", "/api/v1/keys", e.Admin, map[string]any{"name": "b-only", "scopes": []string{"deployments:write"}, "projects": []string{projectB}})
	created := dt.JSON[auth.CreatedKey](t, body)
	req := dt.Request()
	if resp, _ := e.Do("POST", "/api/v1/deployments", created.Key, req); resp.StatusCode != http.StatusForbidden {
		t.Errorf("B's key submits for A: %d", resp.StatusCode)
	}
	req["project_id"] = projectB
	if resp, body := e.Do("POST", "/api/v1/deployments", created.Key, req); resp.StatusCode != http.StatusAccepted {
		t.Errorf("B's key submits for B: %d %s", resp.StatusCode, body)
	}
}

// TestBoundKeyFleetScopes: a key bound to a project that holds the
// fleet's scopes anyway (a row written around auth.Binding: by hand, or by
// a version that did not check) is refused the servers endpoints and the
// keys admin (403), while its deployments scopes still work for its
// project.
func TestBoundKeyFleetScopes(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	secret := auth.NewSecret()
	if _, err := e.DB.Exec(ctx, `INSERT INTO api_keys (id, name, prefix, hash, scopes, projects, fleet_wide, legacy)
		VALUES (gen_random_uuid(), 'bound-operator', $1, $2, $3, $4, false, false)`,
		auth.DisplayPrefix(secret), auth.Hash(secret),
		[]string{"deployments:write", "servers:write", "admin"}, []string{dt.Project}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/servers", nil},
		{"GET", "/api/v1/servers/web-1", nil},
		{"POST", "/api/v1/servers/web-1/provision", nil},
		{"GET", "/api/v1/keys", nil},
		{"POST", "/api/v1/keys", map[string]any{"name": "escalated", "scopes": []string{"admin"}}},
	} {
		if resp, body := e.Do(c.method, c.path, secret, c.body); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s %s with a project-bound key holding fleet scopes: %d %s, want 403", c.method, c.path, resp.StatusCode, body)
		}
	}
	if resp, body := e.Do("POST", "/api/v1/deployments", secret, dt.Request()); resp.StatusCode != http.StatusAccepted {
		t.Errorf("its own project's deployment: %d %s", resp.StatusCode, body)
	}
	req := dt.Request()
	req["project_id"] = projectB
	if resp, body := e.Do("POST", "/api/v1/deployments", secret, req); resp.StatusCode != http.StatusForbidden {
		t.Errorf("another project's deployment: %d %s", resp.StatusCode, body)
	}
}
