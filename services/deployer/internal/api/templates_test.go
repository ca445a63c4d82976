package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// templateBody is a template of project A: jobRequest's job with its SSH
// key by credential name, the limit and extra vars asked on launch, and a
// survey of every question type.
func templateBody(name string) map[string]any {
	job := jobRequest()
	delete(job, "project_id")
	job["credentials"] = map[string]any{"ssh": "prod-ssh"}
	return map[string]any{
		"name": name, "description": "deploy the site",
		"job":           job,
		"ask_on_launch": map[string]any{"limit": true, "extra_vars": true},
		"survey": []map[string]any{
			{"variable": "release", "type": "text", "required": true, "max_length": 20},
			{"variable": "replicas", "type": "integer", "min": 1, "max": 5, "default": 2},
			{"variable": "env", "type": "choice", "choices": []string{"staging", "prod"}, "default": "staging"},
			{"variable": "features", "type": "multi_choice", "choices": []string{"a", "b", "c"}},
		},
	}
}

// lastJobMessage is the newest job request on the job queue.
func lastJobMessage(t *testing.T, e *dt.Env) *messages.AnsibleJobMessage {
	t.Helper()
	entries, err := e.Redis.XRevRangeN(context.Background(), e.Streams.JobQueue, "+", "-", 1).Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("job queue: %d entries (%v)", len(entries), err)
	}
	data, _ := entries[0].Values[messages.DataField].(string)
	m, err := messages.DecodeAnsibleJobMessage([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sshCredential stores the credential prod-ssh that templateBody names,
// with key.
func sshCredential(t *testing.T, e *dt.Env, key string) {
	t.Helper()
	if resp, body := e.Do("POST", "/api/v1/credentials", key, map[string]any{"name": "prod-ssh", "ref": "vault:secret/projects/" + dt.Project + "/ssh#k"}); resp.StatusCode != 201 {
		t.Fatalf("credential: %d %s", resp.StatusCode, body)
	}
}

// createTemplate creates the template body with key.
func createTemplate(t *testing.T, e *dt.Env, key string, body map[string]any) templates.Template {
	t.Helper()
	resp, data := e.Do("POST", "/api/v1/templates", key, body)
	if resp.StatusCode != 201 {
		t.Fatalf("template: %d %s", resp.StatusCode, data)
	}
	return dt.JSON[templates.Template](t, data)
}

// TestTemplates: a project's template (its job checked when saved) is
// launched by a key with templates:launch, with the overrides it asks for
// and survey answers (typed, validated, defaults) as extra variables; the
// job records the template's version; a change makes a new version, older
// ones stay readable and launchable; a stale version is 409; launches are
// idempotent. Another project's key sees none of it (404 as an unknown
// id), and each scope allows only its own part.
func TestTemplates(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	ctx := context.Background()
	writer := e.Key("tpl-writer", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeCredentialsWrite, auth.ScopeJobsRead}, dt.Project)
	launcher := e.Key("tpl-launcher", []auth.Scope{auth.ScopeTemplatesLaunch, auth.ScopeJobsRead}, dt.Project)
	reader := e.Key("tpl-reader", []auth.Scope{auth.ScopeTemplatesRead}, dt.Project)
	keyB := e.Key("tpl-b", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeJobsWrite}, projectB)
	sshRef := "vault:secret/projects/" + dt.Project + "/ssh#private_key"
	if resp, body := e.Do("POST", "/api/v1/credentials", writer, map[string]any{"name": "prod-ssh", "ref": sshRef}); resp.StatusCode != 201 {
		t.Fatalf("credential: %d %s", resp.StatusCode, body)
	}

	resp, body := e.Do("POST", "/api/v1/templates", writer, templateBody("site"))
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Template", body)
	tpl := dt.JSON[templates.Template](t, body)
	if tpl.ProjectID != dt.Project || tpl.Version != 1 || tpl.Latest != 1 || len(tpl.Survey) != 4 ||
		tpl.Job.Credentials.SSH != "prod-ssh" || resp.Header.Get("Location") != "/api/v1/templates/"+tpl.ID {
		t.Fatalf("created %s (Location %s)", body, resp.Header.Get("Location"))
	}

	t.Run("refused when saved", func(t *testing.T) {
		bad := func(mutate func(b map[string]any)) map[string]any {
			b := templateBody("bad")
			mutate(b)
			return b
		}
		for _, tc := range []struct {
			name   string
			key    string
			body   map[string]any
			status int
			field  string
		}{
			{"name taken", writer, templateBody("site"), 409, "name"},
			{"bad name", writer, bad(func(b map[string]any) { b["name"] = "../x" }), 422, "name"},
			{"unknown credential", writer, bad(func(b map[string]any) {
				b["job"].(map[string]any)["credentials"] = map[string]any{"ssh": "no-such"}
			}), 422, "job.credentials.ssh"},
			{"invalid job", writer, bad(func(b map[string]any) {
				b["job"].(map[string]any)["source"].(map[string]any)["type"] = "shell"
			}), 422, "job.source.type"},
			{"webhook in the template", writer, bad(func(b map[string]any) {
				b["job"].(map[string]any)["options"].(map[string]any)["callback_url"] = "https://hooks.example.com/x"
			}), 422, "job.options.callback_url"},
			{"choice without choices", writer, bad(func(b map[string]any) {
				b["survey"] = []map[string]any{{"variable": "env", "type": "choice"}}
			}), 422, "survey[0].choices"},
			{"default not a valid answer", writer, bad(func(b map[string]any) {
				b["survey"] = []map[string]any{{"variable": "n", "type": "integer", "max": 3, "default": 7}}
			}), 422, "survey[0].default"},
			{"unknown question type", writer, bad(func(b map[string]any) {
				b["survey"] = []map[string]any{{"variable": "n", "type": "colour"}}
			}), 422, "survey[0].type"},
			{"another project", writer, bad(func(b map[string]any) { b["project_id"] = projectB }), 403, "project_id"},
			{"without templates:write", launcher, templateBody("x"), 403, ""},
		} {
			resp, body := e.Do("POST", "/api/v1/templates", tc.key, tc.body)
			p := dt.JSON[api.Problem](t, body)
			if resp.StatusCode != tc.status || (tc.field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != tc.field)) {
				t.Errorf("%s: %d %s, want %d naming %q", tc.name, resp.StatusCode, body, tc.status, tc.field)
			}
		}
	})

	var first api.Job
	t.Run("launch", func(t *testing.T) {
		l := map[string]any{"limit": "web-1", "survey": map[string]any{"release": "1.2.3", "env": "prod", "features": []string{"a", "c"}}}
		resp, body := e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch?wait=30s", launcher, l, "Idempotency-Key", "launch-1")
		if resp.StatusCode != 200 {
			t.Fatalf("launch: %d %s", resp.StatusCode, body)
		}
		dt.CheckSchema(t, "Job", body)
		first = dt.JSON[api.Job](t, body)
		req := dt.JSON[struct {
			Request struct {
				Template *struct {
					ID      string `json:"id"`
					Name    string `json:"name"`
					Version int    `json:"version"`
				} `json:"template"`
			} `json:"request"`
		}](t, body)
		if first.Status != "succeeded" || first.Kind != "job" || first.ProjectID != dt.Project || req.Request.Template == nil ||
			*req.Request.Template != (struct {
				ID      string `json:"id"`
				Name    string `json:"name"`
				Version int    `json:"version"`
			}{tpl.ID, "site", 1}) {
			t.Fatalf("launched %s", body)
		}
		m := lastJobMessage(t, e)
		x := m.Options.ExtraVars
		if m.JobID != first.ID || m.Options.Limit != "web-1" || m.Credentials.SSH != sshRef || x["release"] != "1.2.3" ||
			x["replicas"] != int64(2) || x["env"] != "prod" || fmt.Sprint(x["features"]) != "[a c]" || x["http_port"] != int64(8080) {
			t.Errorf("published %+v", m.Options)
		}
		// The same Idempotency-Key replays the launch.
		resp, body = e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", launcher, l, "Idempotency-Key", "launch-1")
		if resp.StatusCode != 202 || resp.Header.Get("Idempotent-Replayed") != "true" || dt.JSON[api.Job](t, body).ID != first.ID {
			t.Errorf("replay: %d %s", resp.StatusCode, body)
		}
		if n, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); n != 1 {
			t.Errorf("%d jobs published, want 1", n)
		}
	})

	t.Run("launch refusals", func(t *testing.T) {
		answers := func(extra map[string]any) map[string]any {
			s := map[string]any{"release": "1.2.3"}
			for k, v := range extra {
				s[k] = v
			}
			return map[string]any{"survey": s}
		}
		for _, tc := range []struct {
			name  string
			body  map[string]any
			field string
		}{
			{"an override not asked for", map[string]any{"tags": []string{"x"}, "survey": map[string]any{"release": "1"}}, "tags"},
			{"a required answer missing", map[string]any{}, "survey.release"},
			{"an integer out of range", answers(map[string]any{"replicas": 9}), "survey.replicas"},
			{"an integer that is no integer", answers(map[string]any{"replicas": 1.5}), "survey.replicas"},
			{"not a choice", answers(map[string]any{"env": "dev"}), "survey.env"},
			{"a choice twice", answers(map[string]any{"features": []string{"a", "a"}}), "survey.features"},
			{"text too long", answers(map[string]any{"release": strings.Repeat("x", 21)}), "survey.release"},
			{"an answer to no question", answers(map[string]any{"nope": 1}), "survey.nope"},
		} {
			resp, body := e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", launcher, tc.body)
			p := dt.JSON[api.Problem](t, body)
			if resp.StatusCode != 422 || len(p.Errors) == 0 || p.Errors[0].Field != tc.field {
				t.Errorf("%s: %d %s, want 422 naming %q", tc.name, resp.StatusCode, body, tc.field)
			}
		}
		// A job submitted whole cannot claim a template.
		job := jobRequest()
		job["template"] = map[string]any{"id": tpl.ID, "name": "site", "version": 1}
		if resp, body := e.Do("POST", "/api/v1/jobs", e.Admin, job); resp.StatusCode != 422 || !strings.Contains(string(body), `"template"`) {
			t.Errorf("a job claiming a template: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", reader, answers(nil)); resp.StatusCode != 403 {
			t.Errorf("templates:read launches: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("versions", func(t *testing.T) {
		b := templateBody("site")
		b["description"] = "deploy the site, v2"
		b["job"].(map[string]any)["source"].(map[string]any)["ref"] = "v2.0.0"
		b["version"] = 1
		resp, body := e.Do("PUT", "/api/v1/templates/"+tpl.ID, writer, b)
		v2 := dt.JSON[templates.Template](t, body)
		if resp.StatusCode != 200 || v2.Version != 2 || v2.Latest != 2 || v2.Job.Source.Ref != "v2.0.0" {
			t.Fatalf("update: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("PUT", "/api/v1/templates/"+tpl.ID, writer, b); resp.StatusCode != 409 {
			t.Errorf("an update from a stale version: %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("GET", "/api/v1/templates/"+tpl.ID+"?version=1", reader, nil)
		if v1 := dt.JSON[templates.Template](t, body); resp.StatusCode != 200 || v1.Version != 1 || v1.Latest != 2 || v1.Job.Source.Ref != "v1.0.0" {
			t.Errorf("version 1: %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("GET", "/api/v1/templates/"+tpl.ID+"/versions", reader, nil)
		list := dt.JSON[api.TemplateList](t, body)
		if resp.StatusCode != 200 || len(list.Items) != 2 || list.Items[0].Version != 2 || list.Items[1].Version != 1 {
			t.Errorf("versions: %d %s", resp.StatusCode, body)
		}
		dt.CheckSchema(t, "TemplateList", body)
		// A launch runs the current version unless it names another.
		l := map[string]any{"survey": map[string]any{"release": "2"}}
		if resp, body := e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", launcher, l); resp.StatusCode != 202 || lastJobMessage(t, e).Source.Ref != "v2.0.0" {
			t.Errorf("launch of the current version: %d %s", resp.StatusCode, body)
		}
		l["version"] = 1
		if resp, body := e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", launcher, l); resp.StatusCode != 202 ||
			lastJobMessage(t, e).Source.Ref != "v1.0.0" || !strings.Contains(string(body), `"version":1`) {
			t.Errorf("launch of version 1: %d %s", resp.StatusCode, body)
		}
		// The first job still shows the version it ran.
		if _, body := e.Do("GET", "/api/v1/jobs/"+first.ID, launcher, nil); !strings.Contains(string(body), `"template":{"id":"`+tpl.ID+`","name":"site","version":1}`) {
			t.Errorf("the first job: %s", body)
		}
	})

	t.Run("tenancy", func(t *testing.T) {
		const unknown = "01a20000-0000-7000-8000-000000000000"
		for _, route := range []struct {
			method, suffix string
			body           any
		}{
			{"GET", "", nil}, {"GET", "?version=1", nil}, {"GET", "/versions", nil},
			{"PUT", "", templateBody("mine")}, {"DELETE", "", nil},
			{"POST", "/launch", map[string]any{"survey": map[string]any{"release": "1"}}},
		} {
			resp, body := e.Do(route.method, "/api/v1/templates/"+tpl.ID+route.suffix, keyB, route.body)
			uresp, ubody := e.Do(route.method, "/api/v1/templates/"+unknown+route.suffix, keyB, route.body)
			if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, body) != problemShape(t, ubody) {
				t.Errorf("B %s %s: %d %s; an unknown one: %d %s", route.method, route.suffix, resp.StatusCode, body, uresp.StatusCode, ubody)
			}
		}
		if _, body := e.Do("GET", "/api/v1/templates", keyB, nil); strings.Contains(string(body), tpl.ID) {
			t.Error("B lists A's template")
		}
		if resp, _ := e.Do("GET", "/api/v1/templates?project_id="+dt.Project, keyB, nil); resp.StatusCode != 403 {
			t.Errorf("B lists A's project: %d", resp.StatusCode)
		}
		// B's own template of the same name is B's: names are per project.
		resp, body := e.Do("POST", "/api/v1/templates", keyB, map[string]any{"name": "site",
			"job": map[string]any{"source": map[string]any{"type": "playbook", "repository": "https://git.example.com/b/p.git", "paths": []string{"site.yml"}},
				"inventory": map[string]any{"type": "inline", "hosts": []string{"198.51.100.9"}}}})
		if resp.StatusCode != 201 {
			t.Fatalf("B's template: %d %s", resp.StatusCode, body)
		}
		// B's template cannot name A's credential.
		b := templateBody("b-ssh")
		if resp, body := e.Do("POST", "/api/v1/templates", keyB, b); resp.StatusCode != 422 || !strings.Contains(string(body), "job.credentials.ssh") {
			t.Errorf("B names A's credential: %d %s", resp.StatusCode, body)
		}
		_, body = e.Do("GET", "/api/v1/templates", reader, nil)
		if list := dt.JSON[api.TemplateList](t, body); len(list.Items) != 1 || list.Items[0].ID != tpl.ID {
			t.Errorf("A's list: %s", body)
		}
	})

	t.Run("delete", func(t *testing.T) {
		if resp, body := e.Do("DELETE", "/api/v1/templates/"+tpl.ID, reader, nil); resp.StatusCode != 403 {
			t.Errorf("templates:read deletes: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("DELETE", "/api/v1/templates/"+tpl.ID, writer, nil); resp.StatusCode != 204 {
			t.Fatalf("delete: %d %s", resp.StatusCode, body)
		}
		if resp, _ := e.Do("GET", "/api/v1/templates/"+tpl.ID, writer, nil); resp.StatusCode != 404 {
			t.Errorf("after delete: %d", resp.StatusCode)
		}
		var n int
		if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM job_template_versions WHERE template_id = $1`, tpl.ID).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d versions left (%v)", n, err)
		}
		if _, body := e.Do("GET", "/api/v1/jobs/"+first.ID, launcher, nil); !strings.Contains(string(body), `"name":"site","version":1`) {
			t.Errorf("the job forgot its template: %s", body)
		}
	})
}

// TestRelaunch: a finished job runs again with the same request (its
// credentials, options and webhook) as a new job of the relaunching key,
// or on its failed and unreachable hosts only; a run not finished, one
// without failed hosts (for "failed"), and another project's are refused;
// a deployment relaunches as a deployment.
func TestRelaunch(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	e := dt.Start(t, dt.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		switch {
		case m.Options.ExtraVars["hold"] == true:
			return fakeinfra.Plan{Tasks: 1, Hold: hold}
		case m.Options.Limit == "":
			return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed, FailedHosts: []string{"web-2"}, UnreachableHosts: []string{"web-3"}}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})
	keyA := e.Key("relaunch-a", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)
	keyB := e.Key("relaunch-b", []auth.Scope{auth.ScopeJobsWrite, auth.ScopeDeploymentsWrite}, projectB)
	req := jobRequest()
	req["inventory"].(map[string]any)["hosts"].(map[string]any)["web-3"] = map[string]any{"ansible_host": "198.51.100.9"}
	resp, body := e.Do("POST", "/api/v1/jobs?wait=30s", keyA, req)
	failed := dt.JSON[api.Job](t, body)
	if resp.StatusCode != 200 || failed.Status != "failed" || failed.Progress.HostsFailed != 1 || failed.Progress.HostsUnreachable != 1 {
		t.Fatalf("the failing job: %d %s", resp.StatusCode, body)
	}

	resp, body = e.Do("POST", "/api/v1/jobs/"+failed.ID+"/relaunch?wait=30s", keyA, map[string]any{"hosts": "failed"})
	again := dt.JSON[api.Job](t, body)
	if resp.StatusCode != 200 || again.ID == failed.ID || again.Status != "succeeded" || !strings.Contains(string(body), `"relaunch_of":"`+failed.ID+`"`) {
		t.Fatalf("relaunch on the failed hosts: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Job", body)
	m := lastJobMessage(t, e)
	if m.JobID != again.ID || m.Options.Limit != "web-2,web-3" || m.Options.ExtraVars["http_port"] != int64(8080) || len(m.Inventory.Hosts) != 3 {
		t.Errorf("relaunched on the failed hosts: %+v", m.Options)
	}
	if resp, body := e.Do("POST", "/api/v1/jobs/"+again.ID+"/relaunch", keyA, map[string]any{"hosts": "failed"}); resp.StatusCode != 409 {
		t.Errorf("failed hosts of a job that succeeded: %d %s", resp.StatusCode, body)
	}
	resp, body = e.Do("POST", "/api/v1/jobs/"+failed.ID+"/relaunch", keyA, nil)
	if resp.StatusCode != 202 || lastJobMessage(t, e).Options.Limit != "" {
		t.Errorf("relaunch on every host: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.Do("POST", "/api/v1/jobs/"+failed.ID+"/relaunch", keyA, map[string]any{"hosts": "some"}); resp.StatusCode != 422 {
		t.Errorf("hosts=some: %d %s", resp.StatusCode, body)
	}

	held := jobRequest()
	held["options"].(map[string]any)["extra_vars"] = map[string]any{"hold": true}
	resp, body = e.Do("POST", "/api/v1/jobs", keyA, held)
	running := dt.JSON[api.Job](t, body)
	if resp.StatusCode != 202 {
		t.Fatalf("held job: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.Do("POST", "/api/v1/jobs/"+running.ID+"/relaunch", keyA, nil); resp.StatusCode != 409 {
		t.Errorf("relaunch of a run not finished: %d %s", resp.StatusCode, body)
	}
	const unknown = "01a20000-0000-7000-8000-000000000000"
	resp, body = e.Do("POST", "/api/v1/jobs/"+failed.ID+"/relaunch", keyB, nil)
	uresp, ubody := e.Do("POST", "/api/v1/jobs/"+unknown+"/relaunch", keyB, nil)
	if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, body) != problemShape(t, ubody) {
		t.Errorf("B relaunches A's job: %d %s; an unknown one: %d %s", resp.StatusCode, body, uresp.StatusCode, ubody)
	}

	resp, body = e.Do("POST", "/api/v1/deployments?wait=30s", e.CI, dt.Request())
	dep := dt.JSON[api.Job](t, body)
	if resp.StatusCode != 200 {
		t.Fatalf("deployment: %d %s", resp.StatusCode, body)
	}
	resp, body = e.Do("POST", "/api/v1/deployments/"+dep.ID+"/relaunch?wait=30s", e.CI, nil)
	if resp.StatusCode != 200 || dt.JSON[api.Job](t, body).ID == dep.ID || !strings.Contains(string(body), `"server_ip":"`) {
		t.Errorf("deployment relaunch: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Deployment", body)
	if resp, body := e.Do("POST", "/api/v1/jobs/"+dep.ID+"/relaunch", keyA, nil); resp.StatusCode != 404 {
		t.Errorf("a jobs key relaunches a deployment: %d %s", resp.StatusCode, body)
	}
}

// secretCanary is a secret survey answer: it must reach Vault and nothing
// else the deployer writes.
const secretCanary = "CANARY-survey-secret-4d1e"

// TestTemplateSecretQuestion: a secret question's answer is written to
// Vault under the launch's path and the job names it by reference in
// secret_vars (on the queue and in its request); the value is in no
// answer, row, stream entry or log line. Without a Vault, a secret
// question is refused when saved.
func TestTemplateSecretQuestion(t *testing.T) {
	t.Parallel()
	vault, env := credentialsVault(t)
	e := dt.Start(t, dt.Options{Env: env})
	ctx := context.Background()
	key := e.Key("tpl-secret", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite, auth.ScopeJobsRead}, dt.Project)
	sshCredential(t, e, key)
	b := templateBody("secret")
	b["survey"] = []map[string]any{{"variable": "db_password", "type": "secret", "required": true}}
	resp, body := e.Do("POST", "/api/v1/templates", key, b)
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	tpl := dt.JSON[templates.Template](t, body)
	l := map[string]any{"survey": map[string]any{"db_password": secretCanary}}
	resp, body = e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch?wait=30s", key, l, "Idempotency-Key", "secret-1")
	if resp.StatusCode != 200 || strings.Contains(string(body), secretCanary) {
		t.Fatalf("launch: %d %s", resp.StatusCode, body)
	}
	j := dt.JSON[api.Job](t, body)
	m := lastJobMessage(t, e)
	ref := m.Options.SecretVars["db_password"]
	prefix := "vault:secret/projects/" + dt.Project + "/launches/"
	if !strings.HasPrefix(ref, prefix) || !strings.HasSuffix(ref, "/db_password?version=1#value") || m.Options.ExtraVars["db_password"] != nil {
		t.Fatalf("published secret_vars %v, extra_vars %v", m.Options.SecretVars, m.Options.ExtraVars)
	}
	path := strings.TrimSuffix(strings.TrimPrefix(ref, "vault:secret/"), "?version=1#value")
	if got := vault.Get("", "secret", path); got["value"] != secretCanary {
		t.Errorf("Vault holds %d fields at %s, not the answer", len(got), path)
	}
	if !strings.Contains(string(body), ref) {
		t.Errorf("the job's request does not name the reference: %s", body)
	}
	// A retry with the Idempotency-Key replays the launch.
	resp, body = e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", key, l, "Idempotency-Key", "secret-1")
	if resp.StatusCode != 202 || dt.JSON[api.Job](t, body).ID != j.ID {
		t.Errorf("replay: %d %s", resp.StatusCode, body)
	}
	// A launch whose answer is refused says so without the value.
	resp, body = e.Do("POST", "/api/v1/templates/"+tpl.ID+"/launch", key, map[string]any{"survey": map[string]any{"db_password": 42}})
	if resp.StatusCode != 422 || !strings.Contains(string(body), "survey.db_password") {
		t.Errorf("a number as the secret: %d %s", resp.StatusCode, body)
	}

	var rows string
	if err := e.DB.QueryRow(ctx, `SELECT coalesce((SELECT string_agg(d::text, ' ') FROM deployments d), '') ||
		coalesce((SELECT string_agg(v::text, ' ') FROM job_template_versions v), '') ||
		coalesce((SELECT string_agg(k::text, ' ') FROM idempotency_keys k), '')`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	entries, err := e.Redis.XRange(ctx, e.Streams.JobQueue, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"a row": rows, "the job queue": fmt.Sprint(entries), "the log": e.Logs.String()} {
		if strings.Contains(text, secretCanary) {
			t.Errorf("%s holds the secret answer", what)
		}
	}

	t.Run("without a Vault", func(t *testing.T) {
		e := dt.Start(t, dt.Options{NoInfra: true})
		key := e.Key("tpl-novault", []auth.Scope{auth.ScopeTemplatesWrite}, dt.Project)
		b := templateBody("secret")
		b["job"].(map[string]any)["credentials"] = map[string]any{}
		b["survey"] = []map[string]any{{"variable": "db_password", "type": "secret"}}
		resp, body := e.Do("POST", "/api/v1/templates", key, b)
		if resp.StatusCode != 422 || !strings.Contains(string(body), "survey[0].type") {
			t.Errorf("a secret question without a Vault: %d %s", resp.StatusCode, body)
		}
	})
}

// TestSchedules: a schedule of a template (checked when made: its cron,
// time zone, missed policy and launch) launches one job per occurrence
// the scheduler writes, as the key that made it, each recorded on its
// occurrence; a launch whose record was lost (a kill -9 between the job
// and the record) is launched again into the same job. Paused, it gets no
// occurrence; a schedule whose key is gone records why it did not launch.
// Another project's key sees none of it.
func TestSchedules(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	ctx := context.Background()
	key := e.Key("sched", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite, auth.ScopeJobsRead}, dt.Project)
	noLaunch := e.Key("sched-nolaunch", []auth.Scope{auth.ScopeTemplatesWrite}, dt.Project)
	keyB := e.Key("sched-b", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch}, projectB)
	sshCredential(t, e, key)
	tpl := createTemplate(t, e, key, templateBody("site"))
	base := "/api/v1/templates/" + tpl.ID + "/schedules"
	sched := map[string]any{"name": "every-second", "cron": "@every 1s", "launch": map[string]any{"survey": map[string]any{"release": "nightly"}}}

	for _, tc := range []struct {
		name   string
		key    string
		body   map[string]any
		status int
		field  string
	}{
		{"bad cron", key, map[string]any{"name": "x", "cron": "61 * * * *"}, 422, "cron"},
		{"bad time zone", key, map[string]any{"name": "x", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, 422, "timezone"},
		{"bad missed policy", key, map[string]any{"name": "x", "cron": "0 9 * * *", "missed": "all", "launch": sched["launch"]}, 422, "missed"},
		{"a launch the survey refuses", key, map[string]any{"name": "x", "cron": "0 9 * * *"}, 422, "launch.survey.release"},
		{"without templates:launch", noLaunch, sched, 403, ""},
	} {
		resp, body := e.Do("POST", base, tc.key, tc.body)
		p := dt.JSON[api.Problem](t, body)
		if resp.StatusCode != tc.status || (tc.field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != tc.field)) {
			t.Errorf("%s: %d %s, want %d naming %q", tc.name, resp.StatusCode, body, tc.status, tc.field)
		}
	}
	resp, body := e.Do("POST", base, key, sched)
	if resp.StatusCode != 201 {
		t.Fatalf("schedule: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Schedule", body)
	sc := dt.JSON[templates.Schedule](t, body)
	if sc.NextAt == nil || len(sc.Upcoming) != 4 || !sc.Upcoming[0].Equal(sc.NextAt.Add(time.Second)) || sc.Missed != "skip" {
		t.Fatalf("created %s", body)
	}
	if resp, _ := e.Do("POST", base, key, sched); resp.StatusCode != 409 {
		t.Errorf("a second schedule of the name: %d", resp.StatusCode)
	}

	// The scheduler's leader writes the occurrences of the next 3 s.
	n, err := schedule.Materialize(ctx, e.DB, time.Now().Add(3*time.Second), 0)
	if err != nil || n < 3 {
		t.Fatalf("materialized %d (%v)", n, err)
	}
	var launched int
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE schedule_id = $1 AND job_id IS NOT NULL`, sc.ID).Scan(&launched); err != nil {
			t.Fatal(err)
		}
		if launched == n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if launched != n {
		t.Fatalf("%d of %d occurrences launched", launched, n)
	}
	if q, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); q != int64(n) {
		t.Errorf("%d jobs published for %d occurrences", q, n)
	}
	resp, body = e.Do("GET", "/api/v1/schedules/"+sc.ID, key, nil)
	got := dt.JSON[templates.Schedule](t, body)
	if resp.StatusCode != 200 || len(got.Recent) != n || got.Recent[0].JobID == "" || got.Recent[0].Error != "" {
		t.Fatalf("schedule after launches: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Schedule", body)
	jobID := got.Recent[0].JobID
	if _, body := e.Do("GET", "/api/v1/jobs/"+jobID, key, nil); !strings.Contains(string(body), `"template":{"id":"`+tpl.ID+`"`) ||
		!strings.Contains(string(body), `"release":"nightly"`) {
		t.Errorf("a scheduled job: %s", body)
	}

	t.Run("a lost record launches into the same job", func(t *testing.T) {
		if _, err := e.DB.Exec(ctx, `UPDATE schedule_occurrences SET launched_at = NULL, job_id = NULL WHERE job_id = $1`, jobID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Parts.Launcher.LaunchDue(ctx, 10); err != nil {
			t.Fatal(err)
		}
		var again string
		if err := e.DB.QueryRow(ctx, `SELECT COALESCE(job_id::text, '') FROM schedule_occurrences WHERE schedule_id = $1 AND occurrence = $2`,
			sc.ID, got.Recent[0].At).Scan(&again); err != nil {
			t.Fatal(err)
		}
		if again != jobID {
			t.Errorf("relaunched into %q, want %s", again, jobID)
		}
		if q, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); q != int64(n) {
			t.Errorf("%d jobs published for %d occurrences", q, n)
		}
	})

	t.Run("tenancy", func(t *testing.T) {
		const unknown = "01a20000-0000-7000-8000-000000000000"
		for _, route := range []struct{ method, path string }{
			{"GET", "/api/v1/schedules/%s"}, {"DELETE", "/api/v1/schedules/%s"}, {"POST", "/api/v1/schedules/%s/pause"},
			{"POST", "/api/v1/schedules/%s/resume"}, {"GET", "/api/v1/templates/%s/schedules"},
		} {
			id := sc.ID
			if strings.Contains(route.path, "templates") {
				id = tpl.ID
			}
			resp, body := e.Do(route.method, fmt.Sprintf(route.path, id), keyB, nil)
			uresp, ubody := e.Do(route.method, fmt.Sprintf(route.path, unknown), keyB, nil)
			if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, body) != problemShape(t, ubody) {
				t.Errorf("B %s %s: %d %s; unknown: %d %s", route.method, route.path, resp.StatusCode, body, uresp.StatusCode, ubody)
			}
		}
		if resp, body := e.Do("POST", base, keyB, sched); resp.StatusCode != 404 {
			t.Errorf("B schedules A's template: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("pause and resume", func(t *testing.T) {
		resp, body := e.Do("POST", "/api/v1/schedules/"+sc.ID+"/pause", key, nil)
		if p := dt.JSON[templates.Schedule](t, body); resp.StatusCode != 200 || !p.Paused || p.NextAt != nil {
			t.Fatalf("pause: %d %s", resp.StatusCode, body)
		}
		if n, err := schedule.Materialize(ctx, e.DB, time.Now().Add(10*time.Second), 0); err != nil || n != 0 {
			t.Errorf("a paused schedule got %d occurrences (%v)", n, err)
		}
		resp, body = e.Do("POST", "/api/v1/schedules/"+sc.ID+"/resume", key, nil)
		if p := dt.JSON[templates.Schedule](t, body); resp.StatusCode != 200 || p.Paused || p.NextAt == nil || p.NextAt.Before(time.Now().Add(-time.Second)) {
			t.Fatalf("resume: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("a key gone", func(t *testing.T) {
		if _, err := e.DB.Exec(ctx, `UPDATE job_schedules SET api_key_id = NULL WHERE id = $1`, sc.ID); err != nil {
			t.Fatal(err)
		}
		var before int
		_ = e.DB.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE schedule_id = $1`, sc.ID).Scan(&before)
		if n, err := schedule.Materialize(ctx, e.DB, time.Now().Add(8*time.Second), 0); err != nil || n == 0 {
			t.Fatalf("materialized %d (%v)", n, err)
		}
		deadline := time.Now().Add(20 * time.Second)
		var refused int
		for time.Now().Before(deadline) && refused == 0 {
			_ = e.DB.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE schedule_id = $1 AND error LIKE '%API key was deleted%'`, sc.ID).Scan(&refused)
			time.Sleep(50 * time.Millisecond)
		}
		if refused == 0 {
			t.Error("an occurrence of a schedule without its key is not recorded as refused")
		}
		if q, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); q != int64(n) {
			t.Errorf("%d jobs published, want %d", q, n)
		}
	})

	if resp, _ := e.Do("DELETE", "/api/v1/schedules/"+sc.ID, key, nil); resp.StatusCode != 204 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	var left int
	if err := e.DB.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE schedule_id = $1`, sc.ID).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d occurrences left (%v)", left, err)
	}
}
