package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestServerOwnershipAttack is issue 31's first attack at the API: project
// A's keys submit a job and a deployment against project B's registered
// server, by handle and by address:port, and against a fleet-only server.
// Each is refused before anything is stored or published (404 for a handle
// A cannot see, exactly as an unknown one; 422 naming the field for an
// address), while A's own server and a fleet-wide key's request pass.
func TestServerOwnershipAttack(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	for _, s := range []struct{ handle, addr, projects string }{
		{"b-web", "198.51.100.20", "{" + projectB + "}"},
		{"a-web", "198.51.100.21", "{" + dt.Project + "}"},
		{"fleet-1", "198.51.100.22", "{}"},
	} {
		if _, err := e.DB.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, projects) VALUES ($1, $2, 2222, $3)`,
			s.handle, s.addr, s.projects); err != nil {
			t.Fatal(err)
		}
	}
	jobsA := e.Key("jobs-a", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	deployA := e.Key("deploy-a", []auth.Scope{auth.ScopeDeploymentsWrite}, dt.Project)
	stored := func() (n int) {
		if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	queued := func() int64 {
		jobs, err := e.Redis.XLen(ctx, e.Streams.JobQueue).Result()
		if err != nil {
			t.Fatal(err)
		}
		return jobs + e.QueueLen()
	}
	job := func(hosts map[string]any) map[string]any {
		r := jobRequest()
		r["inventory"] = map[string]any{"type": "inline", "hosts": hosts}
		r["credentials"] = map[string]any{"ssh": "vault:secret/projects/" + dt.Project + "/ssh#private_key"}
		return r
	}
	deploy := func(ip string) map[string]any {
		r := dt.Request()
		r["server_ip"] = ip
		return r
	}
	_, unknown := e.Do("POST", "/api/v1/jobs", jobsA, job(map[string]any{"x": map[string]any{"autoprov_server": "no-such-server"}}))
	for _, tt := range []struct {
		name   string
		path   string
		key    string
		body   map[string]any
		status int
		field  string
	}{
		{"job: B's server by handle", "/api/v1/jobs", jobsA,
			job(map[string]any{"h": map[string]any{"autoprov_server": "b-web"}}), 404, "inventory.hosts[h][autoprov_server]"},
		{"job: B's server by address", "/api/v1/jobs", jobsA,
			job(map[string]any{"h": map[string]any{"ansible_host": "198.51.100.20"}}), 422, "inventory.hosts[h][ansible_host]"},
		{"job: B's server by address and port", "/api/v1/jobs", jobsA,
			job(map[string]any{"h": map[string]any{"ansible_host": "198.51.100.20", "ansible_port": 2222}}), 422, "inventory.hosts[h][ansible_host]"},
		{"job: B's server by its address as the host's name", "/api/v1/jobs", jobsA,
			job(map[string]any{"198.51.100.20": nil}), 422, "inventory.hosts[198.51.100.20]"},
		{"job: a fleet-only server", "/api/v1/jobs", jobsA,
			job(map[string]any{"h": map[string]any{"ansible_host": "198.51.100.22"}}), 422, "inventory.hosts[h][ansible_host]"},
		{"job: a fleet-only server by handle", "/api/v1/jobs", jobsA,
			job(map[string]any{"h": map[string]any{"autoprov_server": "fleet-1"}}), 404, "inventory.hosts[h][autoprov_server]"},
		{"deployment: B's server", "/api/v1/deployments", deployA, deploy("198.51.100.20"), 422, "server_ip"},
		{"deployment: B's server, another spelling", "/api/v1/deployments", deployA, deploy("::ffff:198.51.100.20"), 422, "server_ip"},
		{"deployment: a fleet-only server", "/api/v1/deployments", deployA, deploy("198.51.100.22"), 422, "server_ip"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s0, q0 := stored(), queued()
			resp, body := e.Do("POST", tt.path, tt.key, tt.body)
			if resp.StatusCode != tt.status || !strings.Contains(string(body), `"field":"`+tt.field+`"`) {
				t.Fatalf("%d %s, want %d naming %s", resp.StatusCode, body, tt.status, tt.field)
			}
			if strings.Contains(string(body), projectB) {
				t.Errorf("the answer names B's project: %s", body)
			}
			if tt.status == 404 && problemShape(t, body) != problemShape(t, []byte(strings.ReplaceAll(string(unknown), "[x]", "[h]"))) {
				t.Errorf("another project's server answers unlike an unknown handle:\n%s\n%s", body, unknown)
			}
			if s, q := stored(), queued(); s != s0 || q != q0 {
				t.Errorf("stored %d -> %d, queued %d -> %d: a refused request left a trace", s0, s, q0, q)
			}
		})
	}

	// A's own server, by handle and by address, and an unregistered host.
	for name, body := range map[string]map[string]any{
		"job on A's server by handle":  job(map[string]any{"h": map[string]any{"autoprov_server": "a-web"}}),
		"job on A's server by address": job(map[string]any{"h": map[string]any{"ansible_host": "198.51.100.21", "ansible_port": 2222}}),
		"job on an unregistered host":  job(map[string]any{"h": map[string]any{"ansible_host": "198.51.100.40"}}),
	} {
		if resp, b := e.Do("POST", "/api/v1/jobs", jobsA, body); resp.StatusCode != http.StatusAccepted {
			t.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	if resp, b := e.Do("POST", "/api/v1/deployments", deployA, deploy("198.51.100.21")); resp.StatusCode != http.StatusAccepted {
		t.Errorf("deployment on A's server: %d %s", resp.StatusCode, b)
	}
	// A fleet-wide key keeps its reach (infra still checks the project
	// it acts for against the owners).
	if resp, b := e.Do("POST", "/api/v1/deployments", e.Admin, deploy("198.51.100.22")); resp.StatusCode != http.StatusAccepted {
		t.Errorf("a fleet-wide key's deployment on a fleet-only server: %d %s", resp.StatusCode, b)
	}
	// But not onto another project's server: infra, which sees only the
	// project, would refuse it after the fact; the API says so at once.
	s0, q0 := stored(), queued()
	if resp, b := e.Do("POST", "/api/v1/deployments", e.Admin, deploy("198.51.100.20")); resp.StatusCode != http.StatusUnprocessableEntity ||
		!strings.Contains(string(b), `"field":"server_ip"`) {
		t.Errorf("a fleet-wide key's deployment of A onto B's server: %d %s, want 422 server_ip", resp.StatusCode, b)
	}
	if resp, b := e.Do("POST", "/api/v1/jobs", e.Admin, job(map[string]any{"h": map[string]any{"autoprov_server": "b-web"}})); resp.StatusCode != http.StatusUnprocessableEntity ||
		!strings.Contains(string(b), `"field":"inventory.hosts[h][autoprov_server]"`) {
		t.Errorf("a fleet-wide key's job of A on B's server by handle: %d %s, want 422", resp.StatusCode, b)
	}
	if s, q := stored(), queued(); s != s0 || q != q0 {
		t.Errorf("stored %d -> %d, queued %d -> %d: a refused request left a trace", s0, s, q0, q)
	}
}
