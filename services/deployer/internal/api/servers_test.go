package api_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

func TestServers(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	for _, s := range []struct{ handle, addr, status, role string }{
		{"web-1", "192.0.2.10", "READY", "web"}, {"web-2", "192.0.2.11", "FAILED", "web"},
		{"db-1", "192.0.2.20", "READY", "db"}, {"gone-1", "192.0.2.30", "ORPHANED", "web"},
	} {
		if _, err := e.DB.Exec(ctx, `INSERT INTO servers (handle, address, status, labels) VALUES ($1, $2, $3, $4)`,
			s.handle, s.addr, s.status, map[string]string{"role": s.role}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.DB.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, state, status)
		VALUES ('job-w1', 'provision', 'provisioner:queue', '1-0', 'server:web-1', 'web-1', 'done', 'succeeded')`); err != nil {
		t.Fatal(err)
	}

	resp, body := e.Do("GET", "/api/v1/servers?label=role=web&status=READY,FAILED", e.Admin, nil)
	list := dt.JSON[api.ServerList](t, body)
	if resp.StatusCode != 200 || len(list.Items) != 2 || list.Counts["READY"] != 1 || list.Counts["FAILED"] != 1 || list.Counts["NEW"] != 0 {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "ServerList", body)
	_, body = e.Do("GET", "/api/v1/servers?limit=2", e.Admin, nil)
	page := dt.JSON[api.ServerList](t, body)
	_, body = e.Do("GET", "/api/v1/servers?limit=2&cursor="+page.NextCursor, e.Admin, nil)
	page2 := dt.JSON[api.ServerList](t, body)
	if len(page.Items) != 2 || len(page2.Items) != 2 || page2.NextCursor != "" || page.Items[1].Handle >= page2.Items[0].Handle {
		t.Errorf("pages: %+v / %+v", page, page2)
	}
	// Sorted by status, paged (the cursor holds the order's value).
	var byStatus []string
	cursor := ""
	for range 5 {
		_, body = e.Do("GET", "/api/v1/servers?sort=status&limit=3&cursor="+cursor, e.Admin, nil)
		p := dt.JSON[api.ServerList](t, body)
		for _, it := range p.Items {
			byStatus = append(byStatus, it.Handle)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if strings.Join(byStatus, " ") != "web-2 gone-1 db-1 web-1" {
		t.Errorf("by status: %v, want FAILED, ORPHANED, then READY by handle", byStatus)
	}
	for q, field := range map[string]string{"sort=bogus": "sort", "sort=attempts&cursor=web-1": "cursor"} {
		if resp, body := e.Do("GET", "/api/v1/servers?"+q, e.Admin, nil); resp.StatusCode != 400 || !strings.Contains(string(body), `"field":"`+field+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", q, resp.StatusCode, body, field)
		}
	}

	resp, body = e.Do("POST", "/api/v1/servers/web-2/recovery", e.Admin, map[string]string{"reason": "disk full fixed"})
	srv := dt.JSON[api.ServerView](t, body)
	if resp.StatusCode != 202 || srv.RequestedAction != "recovery" || srv.RequestedBy != "api:admin" {
		t.Fatalf("recovery: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Server", body)
	resp, body = e.Do("POST", "/api/v1/servers/web-1/pause", e.Admin, nil)
	if srv := dt.JSON[api.ServerView](t, body); resp.StatusCode != 200 || !srv.Paused {
		t.Fatalf("pause: %d %s", resp.StatusCode, body)
	}
	resp, body = e.Do("GET", "/api/v1/servers/web-1", e.Admin, nil)
	detail := dt.JSON[api.ServerDetail](t, body)
	if resp.StatusCode != 200 || len(detail.Runs) != 1 || detail.Runs[0].JobID != "job-w1" || len(detail.History) == 0 || detail.History[0].Event != "paused" {
		t.Fatalf("show: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "ServerDetail", body)
	if resp, body := e.Do("POST", "/api/v1/servers/web-1/resume", e.Admin, nil); resp.StatusCode != 200 || dt.JSON[api.ServerView](t, body).Paused {
		t.Errorf("resume: %d %s", resp.StatusCode, body)
	}
	// history is newest first, as the OpenAPI document says.
	_, body = e.Do("GET", "/api/v1/servers/web-1", e.Admin, nil)
	detail = dt.JSON[api.ServerDetail](t, body)
	if len(detail.History) < 2 || detail.History[0].Event != "resumed" || detail.History[1].Event != "paused" {
		t.Errorf("history after pause, resume: %+v, want newest first", detail.History)
	}
	for i := 1; i < len(detail.History); i++ {
		if detail.History[i].At.After(detail.History[i-1].At) {
			t.Errorf("history[%d] is later than history[%d]: %+v", i, i-1, detail.History)
		}
	}
	for _, c := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"GET", "/api/v1/servers/nope", nil, 404},
		{"POST", "/api/v1/servers/nope/provision", nil, 404},
		{"POST", "/api/v1/servers/gone-1/rebuild", nil, 409},
		{"POST", "/api/v1/servers/web-1/provision", `{"why": 1}`, 400},
		{"GET", "/api/v1/servers?status=BROKEN", nil, 400},
		{"GET", "/api/v1/servers?label=nolabel", nil, 400},
		{"GET", "/api/v1/servers?paused=maybe", nil, 400},
	} {
		if resp, body := e.Do(c.method, c.path, e.Admin, c.body); resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d: %s", c.method, c.path, resp.StatusCode, c.want, body)
		}
	}
	// A deployments key cannot touch servers.
	if resp, _ := e.Do("POST", "/api/v1/servers/web-1/provision", e.CI, nil); resp.StatusCode != 403 {
		t.Errorf("provision with a deployments key: %d", resp.StatusCode)
	}
}

// TestServerProjects: an operator's fleet-wide key sets and clears the
// projects that own a server; every view shows them; the list filters by
// owner; a server whose source sets them answers 409; a project's key
// cannot touch them (403).
func TestServerProjects(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	if _, err := e.DB.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('p-1', '192.0.2.10'), ('p-2', '192.0.2.11')`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Exec(ctx, `INSERT INTO servers (handle, address, source, projects, projects_from_source)
		VALUES ('inv-1', '192.0.2.12', 'static:/inv', ARRAY[$1], true)`, projectB); err != nil {
		t.Fatal(err)
	}
	resp, body := e.Do("PUT", "/api/v1/servers/p-1/projects", e.Admin,
		map[string]any{"projects": []string{projectB, strings.ToUpper(dt.Project)}, "reason": "tenants"})
	srv := dt.JSON[api.ServerView](t, body)
	want := []string{dt.Project, projectB}
	slices.Sort(want)
	if resp.StatusCode != 200 || !slices.Equal(srv.Projects, want) || srv.ProjectsFromSource {
		t.Fatalf("set projects: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Server", body)
	_, body = e.Do("GET", "/api/v1/servers/p-1", e.Admin, nil)
	if d := dt.JSON[api.ServerDetail](t, body); !slices.Equal(d.Server.Projects, want) || d.History[0].Event != "projects" ||
		d.History[0].Actor != "api:admin" || !strings.Contains(d.History[0].Reason, "tenants") {
		t.Errorf("show: %s", body)
	}
	_, body = e.Do("GET", "/api/v1/servers?project="+dt.Project, e.Admin, nil)
	if l := dt.JSON[api.ServerList](t, body); len(l.Items) != 1 || l.Items[0].Handle != "p-1" {
		t.Errorf("servers of the project: %s", body)
	}
	_, body = e.Do("GET", "/api/v1/servers?project=-", e.Admin, nil)
	if l := dt.JSON[api.ServerList](t, body); len(l.Items) != 1 || l.Items[0].Handle != "p-2" || l.Items[0].Projects == nil {
		t.Errorf("fleet-only servers: %s", body)
	}
	if !strings.Contains(string(body), `"projects":[]`) {
		t.Errorf("a fleet-only server's projects are not []: %s", body)
	}
	if resp, body := e.Do("PUT", "/api/v1/servers/p-1/projects", e.Admin, map[string]any{"projects": []string{}}); resp.StatusCode != 200 ||
		len(dt.JSON[api.ServerView](t, body).Projects) != 0 {
		t.Errorf("clear: %d %s", resp.StatusCode, body)
	}
	projectKey := e.Key("a-deploy", []auth.Scope{auth.ScopeDeploymentsWrite}, dt.Project)
	for _, c := range []struct {
		name, handle, key string
		body              any
		want              int
		field             string
	}{
		{"a source's server", "inv-1", e.Admin, map[string]any{"projects": []string{dt.Project}}, 409, ""},
		{"unknown server", "nope", e.Admin, map[string]any{"projects": []string{}}, 404, ""},
		{"no list", "p-1", e.Admin, map[string]any{"reason": "x"}, 422, "projects"},
		{"not a project id", "p-1", e.Admin, map[string]any{"projects": []string{"tenant-b"}}, 422, "projects"},
		{"a project's key", "p-1", projectKey, map[string]any{"projects": []string{dt.Project}}, 403, ""},
	} {
		resp, body := e.Do("PUT", "/api/v1/servers/"+c.handle+"/projects", c.key, c.body)
		if resp.StatusCode != c.want || (c.field != "" && !strings.Contains(string(body), `"field":"`+c.field+`"`)) {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, body, c.want)
		}
	}
}
