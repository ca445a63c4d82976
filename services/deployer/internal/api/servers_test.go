package api_test

import (
	"context"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
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
