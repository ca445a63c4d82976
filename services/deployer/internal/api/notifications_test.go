package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// queued counts a job's queued notifications by rule name and event.
func queued(t *testing.T, e *dt.Env, jobID string) map[string]int {
	t.Helper()
	rows, err := e.DB.Query(context.Background(), `SELECT r.name || ':' || n.event FROM job_notifications n
		JOIN notification_rules r ON r.id = n.rule_id JOIN deployments d ON d.id = n.deployment_id WHERE d.job_id = $1`, jobID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		out[k]++
	}
	return out
}

// TestNotificationRules: a project's rules (of one template or of all)
// are stored by field-checked requests, with their secrets as the
// project's credentials by name; a template-launched job queues one
// notification per matching rule and event (started when infra starts
// it, succeeded or failed at its result), exactly once, and a job not
// launched from a template none. Another project's key neither sees nor
// changes the rules (404 as unknown ids, 403 for the project), and its
// jobs queue none of them.
func TestNotificationRules(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		if m.Options.ExtraVars["fail"] == true {
			return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed, FailedHosts: []string{"web-1"}}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})
	scopes := []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite, auth.ScopeJobsWrite}
	keyA := e.Key("notify-a", scopes, dt.Project)
	reader := e.Key("notify-reader", []auth.Scope{auth.ScopeTemplatesRead}, dt.Project)
	keyB := e.Key("notify-b", scopes, projectB)
	sshCredential(t, e, keyA)
	for _, c := range []string{"slack-url", "bot-token", "hook-secret"} {
		if resp, body := e.Do("POST", "/api/v1/credentials", keyA, map[string]any{"name": c,
			"ref": "vault:secret/projects/" + dt.Project + "/notify#" + c}); resp.StatusCode != 201 {
			t.Fatalf("credential %s: %d %s", c, resp.StatusCode, body)
		}
	}
	tpl := createTemplate(t, e, keyA, templateBody("site"))
	other := createTemplate(t, e, keyA, templateBody("other"))

	create := func(key, path string, body map[string]any) (int, []byte) {
		resp, data := e.Do("POST", path, key, body)
		return resp.StatusCode, data
	}
	status, body := create(keyA, "/api/v1/notifications", map[string]any{"name": "team-slack", "channel": "slack",
		"credential": "slack-url", "events": []string{"started", "succeeded", "failed"}})
	if status != 201 {
		t.Fatalf("project rule: %d %s", status, body)
	}
	dt.CheckSchema(t, "NotificationRule", body)
	slack := dt.JSON[templates.Rule](t, body)
	if slack.ProjectID != dt.Project || slack.TemplateID != "" || slack.Credential != "slack-url" {
		t.Fatalf("project rule: %s", body)
	}
	status, body = create(keyA, "/api/v1/templates/"+tpl.ID+"/notifications", map[string]any{"name": "ops-telegram",
		"channel": "telegram", "target": "-1001234", "credential": "bot-token", "events": []string{"succeeded", "approval_needed"}})
	if status != 201 {
		t.Fatalf("template rule: %d %s", status, body)
	}
	telegram := dt.JSON[templates.Rule](t, body)
	if telegram.TemplateID != tpl.ID || telegram.ProjectID != dt.Project {
		t.Fatalf("template rule: %s", body)
	}
	status, body = create(keyA, "/api/v1/notifications", map[string]any{"name": "oncall-mail", "channel": "email",
		"template_id": other.ID, "target": "oncall@example.com, lead@example.com",
		"email": map[string]any{"server": "smtp.example.com:25", "from": "autoprov@example.com"}, "events": []string{"failed"}})
	if status != 201 {
		t.Fatalf("email rule: %d %s", status, body)
	}
	dt.CheckSchema(t, "NotificationRule", body)
	status, body = create(keyA, "/api/v1/notifications", map[string]any{"name": "ci-hook", "channel": "webhook",
		"target": "https://hooks.example.com/autoprov", "credential": "hook-secret", "events": []string{"failed"}})
	if status != 201 {
		t.Fatalf("webhook rule: %d %s", status, body)
	}

	t.Run("refused by field", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			key    string
			path   string
			body   map[string]any
			status int
			field  string
		}{
			{"name taken", keyA, "/api/v1/notifications", map[string]any{"name": "team-slack", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}, 409, "name"},
			{"bad name", keyA, "/api/v1/notifications", map[string]any{"name": "<b>", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}, 422, "name"},
			{"unknown channel", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "irc", "credential": "slack-url", "events": []string{"failed"}}, 422, "channel"},
			{"no events", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url"}, 422, "events"},
			{"unknown event", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed", "exploded"}}, 422, "events[1]"},
			{"event twice", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed", "failed"}}, 422, "events[1]"},
			{"no credential", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "events": []string{"failed"}}, 422, "credential"},
			{"unknown credential", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "nope", "events": []string{"failed"}}, 422, "credential"},
			{"slack with a target", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "target": "#ops", "credential": "slack-url", "events": []string{"failed"}}, 422, "target"},
			{"bad chat", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "telegram", "target": "ops chat", "credential": "bot-token", "events": []string{"failed"}}, 422, "target"},
			{"bad recipients", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "email", "target": "Ops <ops@example.com>",
				"email": map[string]any{"server": "smtp.example.com:25", "from": "a@example.com"}, "events": []string{"failed"}}, 422, "target"},
			{"header injection", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "email", "target": "ops@example.com",
				"email": map[string]any{"server": "smtp.example.com:25", "from": "a@example.com\r\nBcc: all@example.com"}, "events": []string{"failed"}}, 422, "email.from"},
			{"no server", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "email", "target": "ops@example.com",
				"email": map[string]any{"server": "smtp.example.com", "from": "a@example.com"}, "events": []string{"failed"}}, 422, "email.server"},
			{"user without password", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "email", "target": "ops@example.com",
				"email": map[string]any{"server": "smtp.example.com:587", "from": "a@example.com", "username": "u"}, "events": []string{"failed"}}, 422, "credential"},
			{"email settings elsewhere", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url",
				"email": map[string]any{"server": "smtp.example.com:25"}, "events": []string{"failed"}}, 422, "email"},
			{"target too long", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "webhook", "target": "https://hooks.example.com/" + strings.Repeat("a", 2100), "credential": "hook-secret", "events": []string{"failed"}}, 422, "target"},
			{"webhook to loopback", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "webhook", "target": "http://127.0.0.1:6379/", "credential": "hook-secret", "events": []string{"failed"}}, 422, "target"},
			{"not the template's project", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"},
				"template_id": tpl.ID, "project_id": dt.OtherProject}, 422, "project_id"},
			{"unknown field", keyA, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}, "secret": "s"}, 400, "secret"},
			{"without templates:write", reader, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}, 403, ""},
			{"another project's", keyB, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}, "project_id": dt.Project}, 403, "project_id"},
			{"another project's template", keyB, "/api/v1/templates/" + tpl.ID + "/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}, 404, ""},
			{"another project's credential", keyB, "/api/v1/notifications", map[string]any{"name": "x", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}, 422, "credential"},
		} {
			status, body := create(tc.key, tc.path, tc.body)
			if status != tc.status {
				t.Errorf("%s: %d %s", tc.name, status, body)
				continue
			}
			if tc.field != "" && !hasField(body, tc.field) {
				t.Errorf("%s: no problem for %s: %s", tc.name, tc.field, body)
			}
		}
	})

	t.Run("seen by its project only", func(t *testing.T) {
		resp, body := e.Do("GET", "/api/v1/notifications", reader, nil)
		if list := dt.JSON[api.NotificationRuleList](t, body); resp.StatusCode != 200 || len(list.Items) != 4 {
			t.Errorf("A's list: %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("GET", "/api/v1/templates/"+tpl.ID+"/notifications", reader, nil)
		if list := dt.JSON[api.NotificationRuleList](t, body); resp.StatusCode != 200 || len(list.Items) != 3 {
			t.Errorf("the template's rules and its project's (not other's): %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("GET", "/api/v1/notifications", keyB, nil)
		if list := dt.JSON[api.NotificationRuleList](t, body); resp.StatusCode != 200 || len(list.Items) != 0 {
			t.Errorf("B's list: %d %s", resp.StatusCode, body)
		}
		for _, c := range []struct{ method, path string }{
			{"GET", "/api/v1/notifications/" + slack.ID}, {"DELETE", "/api/v1/notifications/" + slack.ID},
			{"PUT", "/api/v1/notifications/" + slack.ID}, {"GET", "/api/v1/templates/" + tpl.ID + "/notifications"},
		} {
			if resp, body := e.Do(c.method, c.path, keyB, map[string]any{"name": "mine", "channel": "slack", "credential": "slack-url", "events": []string{"failed"}}); resp.StatusCode != 404 {
				t.Errorf("B %s %s: %d %s", c.method, c.path, resp.StatusCode, body)
			}
		}
		if resp, body := e.Do("GET", "/api/v1/notifications?project_id="+dt.Project, keyB, nil); resp.StatusCode != 403 {
			t.Errorf("B lists A's project: %d %s", resp.StatusCode, body)
		}
	})

	// A launch that succeeds: started and succeeded of the project's rule,
	// succeeded of the template's; a failing one: failed of the project's
	// rules; the other template's email rule sees neither.
	launch := func(key, id string, extra map[string]any) string {
		t.Helper()
		l := map[string]any{"survey": map[string]any{"release": "r1"}, "extra_vars": extra, "correlation_id": "<!channel>&co"}
		resp, body := e.Do("POST", "/api/v1/templates/"+id+"/launch?wait=30s", key, l)
		if resp.StatusCode != 200 {
			t.Fatalf("launch: %d %s", resp.StatusCode, body)
		}
		return dt.JSON[api.Job](t, body).ID
	}
	ok := launch(keyA, tpl.ID, map[string]any{"x": 1})
	if got := queued(t, e, ok); len(got) != 3 || got["team-slack:started"] != 1 || got["team-slack:succeeded"] != 1 || got["ops-telegram:succeeded"] != 1 {
		t.Errorf("a job that succeeded queued %v", got)
	}
	failed := launch(keyA, tpl.ID, map[string]any{"fail": true})
	if got := queued(t, e, failed); len(got) != 3 || got["team-slack:started"] != 1 || got["team-slack:failed"] != 1 || got["ci-hook:failed"] != 1 {
		t.Errorf("a job that failed queued %v", got)
	}
	// The result published again changes nothing.
	if _, err := e.DB.Exec(context.Background(), `UPDATE deployments SET status = status WHERE job_id = $1`, failed); err != nil {
		t.Fatal(err)
	}
	if got := queued(t, e, failed); len(got) != 3 {
		t.Errorf("after a second write of the status: %v", got)
	}
	resp, body := e.Do("POST", "/api/v1/jobs?wait=30s", keyA, jobRequest())
	if j := dt.JSON[api.Job](t, body); resp.StatusCode != 200 || len(queued(t, e, j.ID)) != 0 {
		t.Errorf("a job not launched from a template: %d, queued %v", resp.StatusCode, queued(t, e, j.ID))
	}
	resp, body = e.Do("GET", "/api/v1/notifications/"+slack.ID, reader, nil)
	if r := dt.JSON[templates.Rule](t, body); resp.StatusCode != 200 || len(r.Recent) != 4 || r.Recent[0].JobID != failed || r.Recent[0].State != "pending" {
		t.Errorf("the rule's recent notifications: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "NotificationRule", body)

	// Project B: its own template and rule; its jobs queue only its rule.
	if resp, body := e.Do("POST", "/api/v1/credentials", keyB, map[string]any{"name": "prod-ssh", "ref": "vault:secret/projects/" + projectB + "/ssh#k"}); resp.StatusCode != 201 {
		t.Fatalf("B's credential: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.Do("POST", "/api/v1/credentials", keyB, map[string]any{"name": "slack-url", "ref": "vault:secret/projects/" + projectB + "/slack#url"}); resp.StatusCode != 201 {
		t.Fatalf("B's credential: %d %s", resp.StatusCode, body)
	}
	tplB := createTemplate(t, e, keyB, templateBody("site"))
	if status, body := create(keyB, "/api/v1/notifications", map[string]any{"name": "team-slack", "channel": "slack",
		"credential": "slack-url", "events": []string{"succeeded"}}); status != 201 {
		t.Fatalf("B's rule: %d %s", status, body)
	}
	jobB := launch(keyB, tplB.ID, nil)
	if got := queued(t, e, jobB); len(got) != 1 || got["team-slack:succeeded"] != 1 {
		t.Errorf("B's job queued %v", got)
	}
	var ofB int
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM job_notifications n JOIN deployments d ON d.id = n.deployment_id
		WHERE d.job_id = $1 AND n.rule_id IN ($2, $3)`, jobB, slack.ID, telegram.ID).Scan(&ofB); err != nil || ofB != 0 {
		t.Errorf("B's job queued %d of A's rules (%v)", ofB, err)
	}

	t.Run("update and delete", func(t *testing.T) {
		resp, body := e.Do("PUT", "/api/v1/notifications/"+telegram.ID, keyA, map[string]any{"name": "ops-telegram",
			"channel": "telegram", "target": "@ops_channel", "credential": "bot-token", "events": []string{"failed"}})
		if r := dt.JSON[templates.Rule](t, body); resp.StatusCode != 200 || r.Target != "@ops_channel" || r.TemplateID != "" || len(r.Events) != 1 {
			t.Errorf("update: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("PUT", "/api/v1/notifications/"+telegram.ID, keyA, map[string]any{"name": "ops-telegram", "project_id": dt.OtherProject,
			"channel": "telegram", "target": "@ops_channel", "credential": "bot-token", "events": []string{"failed"}}); resp.StatusCode != 403 {
			t.Errorf("moved to another project: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("DELETE", "/api/v1/notifications/"+telegram.ID, keyA, nil); resp.StatusCode != 204 {
			t.Errorf("delete: %d %s", resp.StatusCode, body)
		}
		if resp, _ := e.Do("GET", "/api/v1/notifications/"+telegram.ID, keyA, nil); resp.StatusCode != 404 {
			t.Errorf("deleted rule: %d", resp.StatusCode)
		}
	})
}

// hasField reports whether a problem's body names field among its errors.
func hasField(body []byte, field string) bool {
	var p api.Problem
	if json.Unmarshal(body, &p) != nil {
		return false
	}
	for _, f := range p.Errors {
		if f.Field == field {
			return true
		}
	}
	return false
}

// TestNotificationWebhookWithoutSigningKey: a webhook rule signs with its
// own credential, so a deployer without WEBHOOK_SIGNING_KEY takes it
// (its URL still checked).
func TestNotificationWebhookWithoutSigningKey(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"WEBHOOK_SIGNING_KEY": ""}})
	key := e.Key("notify-nokey", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeCredentialsWrite}, dt.Project)
	if resp, body := e.Do("POST", "/api/v1/credentials", key, map[string]any{"name": "hook-secret",
		"ref": "vault:secret/projects/" + dt.Project + "/notify#hook"}); resp.StatusCode != 201 {
		t.Fatalf("credential: %d %s", resp.StatusCode, body)
	}
	rule := map[string]any{"name": "ci-hook", "channel": "webhook", "target": "https://hooks.example.com/x", "credential": "hook-secret", "events": []string{"failed"}}
	if resp, body := e.Do("POST", "/api/v1/notifications", key, rule); resp.StatusCode != 201 {
		t.Errorf("webhook rule: %d %s", resp.StatusCode, body)
	}
	rule["name"], rule["target"] = "local", "http://10.0.0.1/x"
	if resp, body := e.Do("POST", "/api/v1/notifications", key, rule); resp.StatusCode != 422 || !hasField(body, "target") {
		t.Errorf("a private address: %d %s", resp.StatusCode, body)
	}
}
