package notify_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// approvalRun stores a workflow run of project whose approval node
// "gate<&>" starts waiting, as the deployer's workflow engine writes it:
// the database queues its approval_needed notifications.
func (e *jobsEnv) approvalRun(t *testing.T, project string) string {
	t.Helper()
	ctx := context.Background()
	wf, run := uuid.NewString(), uuid.NewString()
	graph, _ := json.Marshal(map[string]any{"nodes": []map[string]any{
		{"id": "gate<&>", "approval": map[string]any{"description": "ship <b>it</b>?"}}}})
	if _, err := e.db.Exec(ctx, `INSERT INTO workflows (id, project_id, name, graph) VALUES ($1, $2, 'release', $3)`, wf, project, graph); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `INSERT INTO workflow_runs (id, workflow_id, project_id, version, graph, status)
		VALUES ($1, $2, $3, 1, $4, 'running')`, run, wf, project, graph); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `INSERT INTO workflow_nodes (run_id, node, status) VALUES ($1, 'gate<&>', 'pending')`, run); err != nil {
		t.Fatal(err)
	}
	for range 2 { // written again by a later round: still one notification
		if _, err := e.db.Exec(ctx, `UPDATE workflow_nodes SET status = 'waiting', deadline = now() + interval '1 hour'
			WHERE run_id = $1`, run); err != nil {
			t.Fatal(err)
		}
	}
	return run
}

// TestApprovalNeededNotifications: a workflow run's approval that starts
// waiting reaches, once, every rule of its project that names
// approval_needed (Slack escaped, the webhook as workflow.approval_needed
// naming the run and node), and no rule of another project.
func TestApprovalNeededNotifications(t *testing.T) {
	t.Parallel()
	e := setupJobs(t)
	ctx := context.Background()
	for _, r := range []string{"team-slack", "ci-hook"} {
		if _, err := e.db.Exec(ctx, `UPDATE notification_rules SET events = events || '{approval_needed}' WHERE id = $1`,
			e.rules[projectA+"/"+r]); err != nil {
			t.Fatal(err)
		}
	}
	run := e.approvalRun(t, projectA)
	other := e.approvalRun(t, projectB) // B's rule does not name the event
	var queued int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM job_notifications WHERE workflow_run_id IS NOT NULL`).Scan(&queued); err != nil || queued != 2 {
		t.Fatalf("%d approval notifications queued, want 2 (A's slack and hook) (%v)", queued, err)
	}
	stop := e.run()
	testenv.WaitFor(t, 20*time.Second, "the approval's notifications", func() bool { return e.pending(t) == 0 })
	stop()
	slack := e.slackA.Messages()
	if len(slack) != 1 || !strings.Contains(slack[0].Text, "waits for an approval") || !strings.Contains(slack[0].Text, run) ||
		strings.Contains(slack[0].Text, "<b>") || !strings.Contains(slack[0].Text, "gate&lt;&amp;&gt;") ||
		!strings.Contains(slack[0].Text, "ship &lt;b&gt;it&lt;/b&gt;?") {
		t.Errorf("Slack: %+v", slack)
	}
	hooks, bad := e.hooks.got()
	if len(hooks) != 1 || len(bad) != 0 || hooks[0].Event != "workflow.approval_needed" || hooks[0].Workflow == nil ||
		hooks[0].Workflow.RunID != run || hooks[0].Workflow.Node != "gate<&>" || hooks[0].Workflow.Name != "release" || hooks[0].JobID != "" {
		t.Errorf("webhooks: %+v, refused %v", hooks, bad)
	}
	for _, m := range append(e.slackA.Messages(), e.slackB.Messages()...) {
		if strings.Contains(m.Text, other) {
			t.Errorf("B's approval was notified: %q", m.Text)
		}
	}
}
