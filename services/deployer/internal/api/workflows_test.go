package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// stepTemplate is a template of project A whose job carries step=name as
// an extra var, so the stand-in infra knows which step it runs.
func stepTemplate(name string) map[string]any {
	job := jobRequest()
	delete(job, "project_id")
	job["credentials"] = map[string]any{"ssh": "prod-ssh"}
	job["options"] = map[string]any{"extra_vars": map[string]any{"step": name}}
	return map[string]any{"name": name, "job": job, "ask_on_launch": map[string]any{}}
}

// workflowWorld is a deployer whose stand-in infra runs the steps of
// stepTemplate: build sets artifacts, deploy fails when asked to
// (fail_deploy), hold waits for its channel.
type workflowWorld struct {
	e               *dt.Env
	admin, approver string
	approverID      string
	tpl             map[string]string // template ids by step
}

func newWorkflowWorld(t *testing.T, hold chan struct{}) *workflowWorld {
	t.Helper()
	e := dt.Start(t, dt.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		switch m.Options.ExtraVars["step"] {
		case "build":
			return fakeinfra.Plan{Tasks: 1, Artifacts: messages.Vars{"version": "1.2.3", "build_no": int64(7)}}
		case "deploy":
			if m.Options.ExtraVars["fail_deploy"] == true {
				return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed}
			}
		case "hold":
			return fakeinfra.Plan{Tasks: 1, Hold: hold}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})
	w := &workflowWorld{e: e, tpl: map[string]string{}}
	scopes := []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesRead, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite, auth.ScopeJobsRead}
	w.admin = e.Key("wf-admin", scopes, dt.Project)
	w.approver = e.Key("wf-approver", []auth.Scope{auth.ScopeTemplatesLaunch, auth.ScopeTemplatesRead}, dt.Project)
	if err := e.DB.QueryRow(context.Background(), `SELECT id::text FROM api_keys WHERE name = 'wf-approver'`).Scan(&w.approverID); err != nil {
		t.Fatal(err)
	}
	sshCredential(t, e, w.admin)
	for _, step := range []string{"build", "deploy", "rollback", "hold"} {
		w.tpl[step] = createTemplate(t, e, w.admin, stepTemplate(step)).ID
	}
	return w
}

// release is the graph build -> approve -> deploy, with rollback on the
// deploy's failure.
func (w *workflowWorld) release(name string, timeout int) map[string]any {
	return map[string]any{
		"name": name,
		"nodes": []map[string]any{
			{"id": "build", "template_id": w.tpl["build"]},
			{"id": "approve", "approval": map[string]any{"description": "ship it?", "approvers": []string{w.approverID}, "timeout_seconds": timeout}},
			{"id": "deploy", "template_id": w.tpl["deploy"]},
			{"id": "rollback", "template_id": w.tpl["rollback"]},
		},
		"edges": []map[string]any{
			{"from": "build", "to": "approve", "on": "success"},
			{"from": "approve", "to": "deploy", "on": "success"},
			{"from": "deploy", "to": "rollback", "on": "failure"},
		},
	}
}

func (w *workflowWorld) create(t *testing.T, body map[string]any) workflows.Workflow {
	t.Helper()
	resp, data := w.e.Do("POST", "/api/v1/workflows", w.admin, body)
	if resp.StatusCode != 201 {
		t.Fatalf("create workflow: %d %s", resp.StatusCode, data)
	}
	return dt.JSON[workflows.Workflow](t, data)
}

func (w *workflowWorld) launch(t *testing.T, id string, vars map[string]any) workflows.Run {
	t.Helper()
	resp, data := w.e.Do("POST", "/api/v1/workflows/"+id+"/launch", w.admin, map[string]any{"extra_vars": vars})
	if resp.StatusCode != 201 {
		t.Fatalf("launch workflow: %d %s", resp.StatusCode, data)
	}
	dt.CheckSchema(t, "WorkflowRun", data)
	return dt.JSON[workflows.Run](t, data)
}

// wait polls run id until cond holds.
func (w *workflowWorld) wait(t *testing.T, id, what string, cond func(workflows.Run) bool) workflows.Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, data := w.e.Do("GET", "/api/v1/workflow-runs/"+id, w.admin, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("get run: %d %s", resp.StatusCode, data)
		}
		r := dt.JSON[workflows.Run](t, data)
		if cond(r) {
			dt.CheckSchema(t, "WorkflowRun", data)
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, data)
		}
		time.Sleep(100 * time.Millisecond)
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

// states is the run's nodes as "id=status/outcome".
func states(r workflows.Run) string {
	var b []string
	for _, n := range r.Nodes {
		b = append(b, fmt.Sprintf("%s=%s/%s", n.ID, n.Status, n.Outcome))
	}
	return strings.Join(b, " ")
}

// TestWorkflowApproved: build's artifacts reach deploy as extra vars (with
// the launch's), the approval waits for a named approver (another key of
// the project is refused), approval runs deploy, rollback is skipped, the
// run succeeds; the same Idempotency-Key replays the run.
func TestWorkflowApproved(t *testing.T) {
	t.Parallel()
	w := newWorkflowWorld(t, nil)
	// A project rule naming approval_needed: the approval queues it once.
	if resp, body := w.e.Do("POST", "/api/v1/credentials", w.admin, map[string]any{"name": "slack-url",
		"ref": "vault:secret/projects/" + dt.Project + "/notify#slack"}); resp.StatusCode != 201 {
		t.Fatalf("credential: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.e.Do("POST", "/api/v1/notifications", w.admin, map[string]any{"name": "approvals", "channel": "slack",
		"credential": "slack-url", "events": []string{"approval_needed"}}); resp.StatusCode != 201 {
		t.Fatalf("notification rule: %d %s", resp.StatusCode, body)
	}
	wf := w.create(t, w.release("release", 600))
	r := w.launch(t, wf.ID, map[string]any{"env": "prod"})
	if r.Status != workflows.RunRunning || len(r.Nodes) != 4 || r.Version != 1 {
		t.Fatalf("launched run %+v", r)
	}
	r = w.wait(t, r.ID, "the approval", func(r workflows.Run) bool { return node(r, "approve").Status == workflows.NodeWaiting })
	build := node(r, "build")
	if build.Status != workflows.NodeSucceeded || build.JobID == "" || build.Artifacts["version"] != "1.2.3" {
		t.Fatalf("build node %+v", build)
	}
	if d := node(r, "approve").Deadline; d == nil || time.Until(*d) < 9*time.Minute {
		t.Errorf("approval deadline %v, want about 10 minutes from now", d)
	}

	var queued int
	if err := w.e.DB.QueryRow(context.Background(), `SELECT count(*) FROM job_notifications
		WHERE workflow_run_id = $1 AND node = 'approve' AND event = 'approval_needed'`, r.ID).Scan(&queued); err != nil || queued != 1 {
		t.Errorf("%d approval_needed notifications queued, want 1 (%v)", queued, err)
	}
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/nodes/approve/approve", w.admin, nil); resp.StatusCode != 403 {
		t.Errorf("a key that is not an approver approves: %d %s", resp.StatusCode, body)
	}
	resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/nodes/approve/approve", w.approver, map[string]any{"reason": "looks good"})
	if resp.StatusCode != 200 {
		t.Fatalf("approve: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/nodes/approve/approve", w.approver, nil); resp.StatusCode != 409 {
		t.Errorf("approve twice: %d %s", resp.StatusCode, body)
	}
	r = w.wait(t, r.ID, "the run's end", func(r workflows.Run) bool { return r.FinishedAt != nil })
	if r.Status != workflows.RunSucceeded || states(r) != "build=succeeded/succeeded approve=succeeded/approved deploy=succeeded/succeeded rollback=skipped/" {
		t.Fatalf("run %s: %s (%s)", r.Status, states(r), r.Error)
	}
	if a := node(r, "approve"); a.DecidedBy != w.approverID || a.Reason != "looks good" {
		t.Errorf("approval %+v", a)
	}
	var deploy *messages.AnsibleJobMessage
	for _, m := range w.e.Infra.Jobs() {
		if m.JobID == node(r, "deploy").JobID {
			deploy = m
		}
	}
	if deploy == nil {
		t.Fatal("the deploy node's job never reached infra")
	}
	if v := deploy.Options.ExtraVars; v["version"] != "1.2.3" || v["build_no"] != int64(7) || v["env"] != "prod" || v["step"] != "deploy" {
		t.Errorf("deploy's extra vars %v, want build's artifacts, the launch's env and its own step", v)
	}

	// The same Idempotency-Key: the same run, not a second.
	resp, body = w.e.Do("POST", "/api/v1/workflows/"+wf.ID+"/launch", w.admin, nil, "Idempotency-Key", "release-42")
	first := dt.JSON[workflows.Run](t, body)
	resp2, body2 := w.e.Do("POST", "/api/v1/workflows/"+wf.ID+"/launch", w.admin, nil, "Idempotency-Key", "release-42")
	if resp.StatusCode != 201 || resp2.StatusCode != 200 || dt.JSON[workflows.Run](t, body2).ID != first.ID {
		t.Errorf("idempotent launch: %d %s; again %d %s", resp.StatusCode, body, resp2.StatusCode, body2)
	}
	resp, body = w.e.Do("GET", "/api/v1/workflows/"+wf.ID+"/runs", w.admin, nil)
	if resp.StatusCode != 200 || strings.Count(string(body), `"workflow_id"`) != 2 {
		t.Errorf("runs: %d %s", resp.StatusCode, body)
	}
}

// TestWorkflowDeniedTimedOutAndFailurePath: a denied approval and one that
// times out fail the run (no path handles their failure) and skip deploy;
// a deploy that fails takes the failure edge to rollback, and the run,
// whose failure was handled, succeeds.
func TestWorkflowDeniedTimedOutAndFailurePath(t *testing.T) {
	t.Parallel()
	w := newWorkflowWorld(t, nil)
	wf := w.create(t, w.release("release", 600))
	r := w.launch(t, wf.ID, nil)
	w.wait(t, r.ID, "the approval", func(r workflows.Run) bool { return node(r, "approve").Status == workflows.NodeWaiting })
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/nodes/approve/deny", w.approver, map[string]any{"reason": "not today"}); resp.StatusCode != 200 {
		t.Fatalf("deny: %d %s", resp.StatusCode, body)
	}
	r = w.wait(t, r.ID, "the run's end", func(r workflows.Run) bool { return r.FinishedAt != nil })
	if r.Status != workflows.RunFailed || states(r) != "build=succeeded/succeeded approve=failed/denied deploy=skipped/ rollback=skipped/" ||
		!strings.Contains(r.Error, "approve (denied)") {
		t.Errorf("denied run %s: %s (%s)", r.Status, states(r), r.Error)
	}

	quick := w.create(t, w.release("quick", 1))
	r = w.launch(t, quick.ID, nil)
	r = w.wait(t, r.ID, "the run's end", func(r workflows.Run) bool { return r.FinishedAt != nil })
	if r.Status != workflows.RunFailed || states(r) != "build=succeeded/succeeded approve=failed/timed_out deploy=skipped/ rollback=skipped/" {
		t.Errorf("timed out run %s: %s (%s)", r.Status, states(r), r.Error)
	}
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/nodes/approve/approve", w.approver, nil); resp.StatusCode != 409 {
		t.Errorf("approve after the timeout: %d %s", resp.StatusCode, body)
	}

	direct := w.create(t, map[string]any{
		"name": "direct",
		"nodes": []map[string]any{
			{"id": "deploy", "template_id": w.tpl["deploy"]},
			{"id": "rollback", "template_id": w.tpl["rollback"]},
			{"id": "report", "template_id": w.tpl["build"]},
		},
		"edges": []map[string]any{
			{"from": "deploy", "to": "rollback", "on": "failure"},
			{"from": "deploy", "to": "report", "on": "always"},
		},
	})
	r = w.launch(t, direct.ID, map[string]any{"fail_deploy": true})
	r = w.wait(t, r.ID, "the run's end", func(r workflows.Run) bool { return r.FinishedAt != nil })
	if r.Status != workflows.RunSucceeded || states(r) != "deploy=failed/failed rollback=succeeded/succeeded report=succeeded/succeeded" {
		t.Errorf("failure path run %s: %s (%s)", r.Status, states(r), r.Error)
	}
}

// TestWorkflowCancel: cancelling a run cancels its running job and every
// node not started; the run ends cancelled and cannot be cancelled again.
func TestWorkflowCancel(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	w := newWorkflowWorld(t, hold)
	wf := w.create(t, map[string]any{
		"name": "held",
		"nodes": []map[string]any{
			{"id": "hold", "template_id": w.tpl["hold"]},
			{"id": "after", "template_id": w.tpl["build"]},
		},
		"edges": []map[string]any{{"from": "hold", "to": "after", "on": "always"}},
	})
	r := w.launch(t, wf.ID, nil)
	r = w.wait(t, r.ID, "the held job", func(r workflows.Run) bool { return node(r, "hold").JobID != "" })
	job := node(r, "hold").JobID
	testenv.WaitFor(t, 20*time.Second, "the held job to start", func() bool { return w.e.Infra.Started(job) > 0 })
	resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/cancel", w.admin, nil)
	if resp.StatusCode != 202 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	r = w.wait(t, r.ID, "the run's end", func(r workflows.Run) bool { return r.FinishedAt != nil })
	if r.Status != workflows.RunCancelled || states(r) != "hold=cancelled/cancelled after=cancelled/" {
		t.Errorf("cancelled run %s: %s", r.Status, states(r))
	}
	if resp, body := w.e.Do("GET", "/api/v1/jobs/"+job, w.admin, nil); resp.StatusCode != 200 || !strings.Contains(string(body), `"status":"cancelled"`) {
		t.Errorf("the held job: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+r.ID+"/cancel", w.admin, nil); resp.StatusCode != 409 {
		t.Errorf("cancel an ended run: %d %s", resp.StatusCode, body)
	}
}

// TestWorkflowValidationAndTenancy: a bad graph is 422 by field; another
// project's key sees none of A's workflows or runs (404 as an unknown id),
// cannot launch, approve or cancel them, and cannot build a workflow of
// A's templates; scopes keep readers from writing or launching.
func TestWorkflowValidationAndTenancy(t *testing.T) {
	t.Parallel()
	w := newWorkflowWorld(t, nil)
	for name, tc := range map[string]struct {
		body  map[string]any
		field string
	}{
		"cycle": {map[string]any{"name": "c", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"]}, {"id": "b", "template_id": w.tpl["build"]}},
			"edges": []map[string]any{{"from": "a", "to": "b", "on": "success"}, {"from": "b", "to": "a", "on": "always"}}}, "edges"},
		"unknown node": {map[string]any{"name": "u", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"]}},
			"edges": []map[string]any{{"from": "a", "to": "z", "on": "success"}}}, "edges[0].to"},
		"bad on": {map[string]any{"name": "o", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"]}, {"id": "b", "template_id": w.tpl["build"]}},
			"edges": []map[string]any{{"from": "a", "to": "b", "on": "sometimes"}}}, "edges[0].on"},
		"both kinds":       {map[string]any{"name": "k", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"], "approval": map[string]any{}}}}, "nodes[0]"},
		"duplicate id":     {map[string]any{"name": "d", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"]}, {"id": "a", "template_id": w.tpl["build"]}}}, "nodes[1].id"},
		"unknown template": {map[string]any{"name": "t", "nodes": []map[string]any{{"id": "a", "template_id": "01a20000-0000-7000-8000-000000000000"}}}, "nodes[0].template_id"},
		"launch not asked": {map[string]any{"name": "l", "nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"], "launch": map[string]any{"limit": "web-1"}}}}, "nodes[0].launch.limit"},
		"no node":          {map[string]any{"name": "n", "nodes": []map[string]any{}}, "nodes"},
	} {
		resp, body := w.e.Do("POST", "/api/v1/workflows", w.admin, tc.body)
		if resp.StatusCode != 422 || !strings.Contains(string(body), `"field":"`+tc.field+`"`) {
			t.Errorf("%s: %d %s, want 422 naming %s", name, resp.StatusCode, body, tc.field)
		}
	}

	wf := w.create(t, w.release("release", 600))
	run := w.launch(t, wf.ID, nil)
	w.wait(t, run.ID, "the approval", func(r workflows.Run) bool { return node(r, "approve").Status == workflows.NodeWaiting })

	keyB := w.e.Key("wf-b", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesRead, auth.ScopeTemplatesLaunch}, projectB)
	const unknown = "01a20000-0000-7000-8000-000000000000"
	for _, c := range []struct{ method, path, unknownPath string }{
		{"GET", "/api/v1/workflows/" + wf.ID, "/api/v1/workflows/" + unknown},
		{"PUT", "/api/v1/workflows/" + wf.ID, "/api/v1/workflows/" + unknown},
		{"DELETE", "/api/v1/workflows/" + wf.ID, "/api/v1/workflows/" + unknown},
		{"POST", "/api/v1/workflows/" + wf.ID + "/launch", "/api/v1/workflows/" + unknown + "/launch"},
		{"GET", "/api/v1/workflows/" + wf.ID + "/runs", "/api/v1/workflows/" + unknown + "/runs"},
		{"GET", "/api/v1/workflow-runs/" + run.ID, "/api/v1/workflow-runs/" + unknown},
		{"POST", "/api/v1/workflow-runs/" + run.ID + "/cancel", "/api/v1/workflow-runs/" + unknown + "/cancel"},
		{"POST", "/api/v1/workflow-runs/" + run.ID + "/nodes/approve/approve", "/api/v1/workflow-runs/" + unknown + "/nodes/approve/approve"},
	} {
		body := map[string]any{}
		if c.method == "PUT" {
			body = w.release("stolen", 600)
		}
		resp, data := w.e.Do(c.method, c.path, keyB, body)
		uresp, udata := w.e.Do(c.method, c.unknownPath, keyB, body)
		if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, data) != problemShape(t, udata) {
			t.Errorf("B: %s %s: %d %s; unknown: %d %s", c.method, c.path, resp.StatusCode, data, uresp.StatusCode, udata)
		}
	}
	resp, body := w.e.Do("GET", "/api/v1/workflows", keyB, nil)
	if resp.StatusCode != 200 || strings.Contains(string(body), wf.ID) {
		t.Errorf("B lists A's workflows: %d %s", resp.StatusCode, body)
	}
	resp, body = w.e.Do("POST", "/api/v1/workflows", keyB, map[string]any{"name": "mine",
		"nodes": []map[string]any{{"id": "a", "template_id": w.tpl["build"]}}})
	if resp.StatusCode != 422 || !strings.Contains(string(body), `"field":"nodes[0].template_id"`) {
		t.Errorf("B builds a workflow of A's template: %d %s", resp.StatusCode, body)
	}
	if r := w.wait(t, run.ID, "A's run untouched", func(workflows.Run) bool { return true }); r.Status != workflows.RunRunning ||
		node(r, "approve").Status != workflows.NodeWaiting {
		t.Errorf("A's run after B's attempts: %s %s", r.Status, states(r))
	}

	reader := w.e.Key("wf-reader", []auth.Scope{auth.ScopeTemplatesRead}, dt.Project)
	if resp, body := w.e.Do("POST", "/api/v1/workflows/"+wf.ID+"/launch", reader, nil); resp.StatusCode != 403 {
		t.Errorf("a reader launches: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.e.Do("POST", "/api/v1/workflow-runs/"+run.ID+"/nodes/approve/approve", reader, nil); resp.StatusCode != 403 {
		t.Errorf("a reader approves: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.e.Do("PUT", "/api/v1/workflows/"+wf.ID, w.approver, w.release("release", 60)); resp.StatusCode != 403 {
		t.Errorf("a launcher edits: %d %s", resp.StatusCode, body)
	}
	resp, body = w.e.Do("PUT", "/api/v1/workflows/"+wf.ID, w.admin, w.release("release", 60))
	if resp.StatusCode != 200 || dt.JSON[workflows.Workflow](t, body).Version != 2 {
		t.Errorf("update: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Workflow", body)
	if r := w.wait(t, run.ID, "the run's graph", func(workflows.Run) bool { return true }); r.Version != 1 || r.Graph.Nodes[1].Approval.TimeoutSeconds != 600 {
		t.Errorf("a started run's graph changed with the workflow: version %d", r.Version)
	}
}
