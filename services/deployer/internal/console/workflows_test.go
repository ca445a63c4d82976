package console_test

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// TestWorkflowPages: the workflows list, a workflow drawn as its graph
// with its nodes and a launch form, and a run drawn with each node's
// state and job; the approval waiting in it is approved from the page
// (with the CSRF token only), the run goes on to its end and the page
// shows it. Markup is escaped; another project's key gets 404 on every
// page and form.
func TestWorkflowPages(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		if m.Options.ExtraVars["step"] == "build" {
			return fakeinfra.Plan{Tasks: 1, Artifacts: messages.Vars{"version": "1.2.3"}}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})
	key := e.Key("wf", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesRead, auth.ScopeTemplatesLaunch,
		auth.ScopeCredentialsWrite, auth.ScopeJobsRead}, deployertest.Project)
	tpl := map[string]string{}
	for _, step := range []string{"build", "deploy"} {
		job := templateJob()
		job["options"] = map[string]any{"extra_vars": map[string]any{"step": step}}
		tpl[step] = newTemplate(t, e, key, map[string]any{"name": step, "job": job}).ID
	}
	res, body := e.Do(http.MethodPost, "/api/v1/workflows", key, map[string]any{
		"name": "release", "description": markup,
		"nodes": []map[string]any{
			{"id": "build", "template_id": tpl["build"]},
			{"id": "approve", "approval": map[string]any{"description": "ship " + markup + "?"}},
			{"id": "deploy", "template_id": tpl["deploy"]},
		},
		"edges": []map[string]any{{"from": "build", "to": "approve", "on": "success"}, {"from": "approve", "to": "deploy", "on": "success"}},
	})
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("workflow: %d %s", res.StatusCode, body)
	}
	wf := deployertest.JSON[workflows.Workflow](t, body)

	b := newBrowser(t, e.URL)
	csrf := b.signIn(key)
	if _, page := b.get("/ui/"); !strings.Contains(page, `href="/ui/workflows"`) {
		t.Error("no Workflows in the navigation of a templates key")
	}
	if res, page := b.get("/ui/workflows"); res.StatusCode != http.StatusOK || !strings.Contains(page, `href="/ui/workflows/`+wf.ID+`"`) {
		t.Errorf("workflows list: %d\n%s", res.StatusCode, page)
	}
	res, page := b.get("/ui/workflows/" + wf.ID)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="workflow-graph"`) || strings.Count(page, `class="wf-node `) != 3 ||
		strings.Count(page, `class="wf-edge `) != 2 || !strings.Contains(page, `id="launch-workflow"`) {
		t.Fatalf("workflow page: %d\n%s", res.StatusCode, page)
	}
	if strings.Contains(page, markup) || !strings.Contains(page, html.EscapeString(markup)) {
		t.Error("the workflow's description is not escaped")
	}

	if res, _ := b.post("/ui/workflows/"+wf.ID+"/launch", url.Values{"extra_vars": {`{"channel": "stable"}`}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("launch without the CSRF token: %d", res.StatusCode)
	}
	if res, _ := b.post("/ui/workflows/"+wf.ID+"/launch", url.Values{"csrf": {csrf}, "extra_vars": {`not json`}}); res.StatusCode != http.StatusSeeOther ||
		!strings.Contains(res.Header.Get("Location"), "error=") {
		t.Errorf("launch with bad extra vars: %d %s", res.StatusCode, res.Header.Get("Location"))
	}
	res, _ = b.post("/ui/workflows/"+wf.ID+"/launch", url.Values{"csrf": {csrf}, "extra_vars": {`{"channel": "stable"}`}})
	loc := res.Header.Get("Location")
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/workflow-runs/") {
		t.Fatalf("launch: %d %s", res.StatusCode, loc)
	}
	runID := strings.TrimPrefix(loc, "/ui/workflow-runs/")
	testenv.WaitFor(t, 30*time.Second, "the approval to wait", func() bool {
		_, page = b.get(loc)
		return strings.Contains(page, `id="approval-approve"`)
	})
	if strings.Contains(page, markup) || !strings.Contains(page, `data-node="build"`) || !strings.Contains(page, "version=1.2.3") {
		t.Errorf("run page while the approval waits:\n%s", page)
	}

	keyB := e.Key("wf-b", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesRead, auth.ScopeTemplatesLaunch}, "22222222-3333-4444-5555-666666666666")
	other := newBrowser(t, e.URL)
	csrfB := other.signIn(keyB)
	for _, p := range []string{"/ui/workflows/" + wf.ID, loc} {
		if res, page := other.get(p); res.StatusCode != http.StatusNotFound || strings.Contains(page, "release") {
			t.Errorf("B gets %s: %d", p, res.StatusCode)
		}
	}
	for _, p := range []string{loc + "/nodes/approve/approve", loc + "/cancel", "/ui/workflows/" + wf.ID + "/launch"} {
		if res, _ := other.post(p, url.Values{"csrf": {csrfB}}); res.StatusCode != http.StatusNotFound {
			t.Errorf("B posts %s: %d", p, res.StatusCode)
		}
	}
	if res, page := other.get("/ui/workflows"); res.StatusCode != http.StatusOK || strings.Contains(page, wf.ID) {
		t.Errorf("B's workflows list shows A's: %d", res.StatusCode)
	}

	res, _ = b.post(loc+"/nodes/approve/approve", url.Values{"csrf": {csrf}, "reason": {"go"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve: %d", res.StatusCode)
	}
	testenv.WaitFor(t, 30*time.Second, "the run to succeed", func() bool {
		_, page = b.get(loc)
		return strings.Contains(page, `id="run-status">succeeded`)
	})
	var run workflows.Run
	_, body = e.Do(http.MethodGet, "/api/v1/workflow-runs/"+runID, key, nil)
	run = deployertest.JSON[workflows.Run](t, body)
	deploy := node(run, "deploy")
	if deploy.JobID == "" || !strings.Contains(page, `href="/ui/runs/job/`+deploy.JobID+`"`) ||
		!strings.Contains(page, `class="wf-node wf-job st-succeeded" data-node="deploy"`) || strings.Contains(page, `id="cancel"`) {
		t.Errorf("run page at the end (deploy %+v):\n%s", deploy, page)
	}
}

func node(r workflows.Run, id string) workflows.NodeRun {
	for _, n := range r.Nodes {
		if n.ID == id {
			return n
		}
	}
	return workflows.NodeRun{}
}
