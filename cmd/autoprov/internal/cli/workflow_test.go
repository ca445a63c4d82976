package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// releaseWorkflow is a workflow of the test project: an approval, and on
// its failure (a deny) the template TPL launched with a survey answer.
const releaseWorkflow = `{"name":"release","description":"ship the site",
	"nodes":[{"id":"gate","approval":{"description":"ship it?","timeout_seconds":600}},
		{"id":"rollback","template_id":"TPL","launch":{"survey":{"release":"2.0"}}}],
	"edges":[{"from":"gate","to":"rollback","on":"failure"}]}`

// queuedJob is the one entry of the job queue: its id and its request.
func queuedJob(t *testing.T, rdb *redis.Client) (string, *messages.AnsibleJobMessage) {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), messages.StreamAnsibleJobQueue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("%d entries on the job queue (%v)", len(entries), err)
	}
	data, _ := entries[0].Values[messages.DataField].(string)
	m, err := messages.DecodeAnsibleJobMessage([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return entries[0].ID, m
}

// finishJob stands in for infra: it reads the one job on the job queue
// and publishes its result, succeeded with artifacts, on job:results; it
// returns the job's id.
func finishJob(t *testing.T, rdb *redis.Client, artifacts messages.Vars) string {
	t.Helper()
	entryID, m := queuedJob(t, rdb)
	res := messages.NewAnsibleJobResult(m, entryID)
	res.Succeed()
	res.SetTimes(time.Now(), time.Now())
	if dropped := res.SetArtifacts(artifacts); len(dropped) > 0 {
		t.Fatalf("artifacts dropped: %v", dropped)
	}
	enc, err := messages.Encode(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: messages.StreamJobResults, Values: map[string]any{messages.DataField: enc}}).Err(); err != nil {
		t.Fatal(err)
	}
	return m.JobID
}

// runID is the id of the run whose first line (`workflow run ID: ...` or
// `workflow run ID started`) out holds.
func runID(t *testing.T, out string) string {
	t.Helper()
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "workflow" && f[1] == "run" {
			return strings.TrimSuffix(f[2], ":")
		}
	}
	t.Fatalf("no run in:\n%s", out)
	return ""
}

// nodeRow is the cells of node's row in what run show printed (nil: none).
func nodeRow(out, node string) []string {
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == node {
			return f
		}
	}
	return nil
}

// waitNode runs `workflow run show` of run id until node's row shows
// status, and returns what it printed.
func waitNode(t *testing.T, env map[string]string, id, node, status string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		stdout, stderr, code := run(t, env, "workflow", "run", "show", id)
		if f := nodeRow(stdout, node); code == 0 && len(f) > 1 && f[1] == status {
			return stdout
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s of run %s is not %s: %d %s %s", node, id, status, code, stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkflowCommands: `autoprov workflow` against the real deployer and
// its workflow engine: create (the graph shown as text), list, a cyclic
// graph refused by field; a launch --follow that waits for the approval,
// approved from the command line, followed to the end (exit 0); the same
// Idempotency-Key replays the run; a deny whose failure edge launches the
// template's job, ended by a stand-in for infra with artifacts (follow
// exits 0, run show prints them); a cancel (follow exits 1); update,
// delete; a key of another project finds none of it.
func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	d := startDeployer(t)
	env := d.cliEnv(d.key(t, "templates:write,templates:launch", testProject))
	tpl := createTemplate(t, env)
	file := writeFile(t, "release.json", strings.Replace(releaseWorkflow, "TPL", tpl, 1))

	stdout, stderr, code := run(t, env, "workflow", "create", file)
	if code != 0 || !strings.Contains(stdout, "workflow release ") || !strings.Contains(stdout, ": version 1\n") ||
		!strings.Contains(stdout, "a run starts with: gate\n") ||
		!strings.Contains(stdout, `waits for an approval ("ship it?") by a key of the project with templates:launch, for at most 10m0s`) ||
		!strings.Contains(stdout, `launches the template `+tpl+` with {"survey":{"release":"2.0"}}`) ||
		!strings.Contains(stdout, "    gate -> rollback on failure\n") {
		t.Fatalf("workflow create: %d %s %s", code, stdout, stderr)
	}
	wf := strings.TrimSuffix(strings.Fields(stdout)[2], ":")
	if stdout, stderr, code := run(t, env, "workflows", "list"); code != 0 || !strings.Contains(stdout, wf) || !strings.Contains(stdout, "ship the site") {
		t.Errorf("workflow list: %d %s %s", code, stdout, stderr)
	}

	cyclic := `{"name":"loop","nodes":[{"id":"a","approval":{}},{"id":"b","approval":{}}],
		"edges":[{"from":"a","to":"b","on":"success"},{"from":"b","to":"a","on":"always"}]}`
	if _, stderr, code := run(t, env, "workflow", "create", writeFile(t, "loop.json", cyclic)); code != ExitFailed ||
		!strings.Contains(stderr, "create the workflow: HTTP 422") || !strings.Contains(stderr, "\n  edges: the graph has a cycle through node ") {
		t.Errorf("a cyclic graph: %d %s", code, stderr)
	}
	if _, stderr, code := run(t, env, "workflow", "launch", wf, "--var", "a=1", "--extra-vars", `{"b":2}`); code != ExitUsage {
		t.Errorf("--var with --extra-vars: %d %s", code, stderr)
	}

	// launch --follow waits for the approval, given from another command.
	type result struct {
		stdout, stderr string
		code           int
	}
	followed := make(chan result, 1)
	go func() {
		stdout, stderr, code := run(t, env, "workflow", "launch", wf, "--var", "channel=stable", "--var", "note=a;b", "--idempotency-key", "release-1",
			"--follow", "--poll", "100ms")
		followed <- result{stdout, stderr, code}
	}()
	var runs struct {
		Items []struct{ ID, Status string }
	}
	for deadline := time.Now().Add(time.Minute); len(runs.Items) == 0; time.Sleep(100 * time.Millisecond) {
		stdout, stderr, code := run(t, env, "--json", "workflow", "runs", wf)
		if code != 0 || time.Now().After(deadline) {
			t.Fatalf("workflow runs: %d %s %s", code, stdout, stderr)
		}
		mustJSON(t, stdout, &runs)
	}
	first := runs.Items[0].ID
	shown := waitNode(t, env, first, "gate", "waiting")
	if !strings.Contains(shown, "workflow run "+first+": running") || !strings.Contains(shown, `extra vars: {"channel":"stable","note":"a;b"}`) ||
		!strings.Contains(shown, "DEADLINE") || !strings.Contains(shown, " "+time.Now().UTC().Add(10*time.Minute).Format("2006-01-02")+" ") {
		t.Errorf("run show of a waiting approval:\n%s", shown)
	}
	if stdout, stderr, code := run(t, env, "workflow", "runs", wf); code != 0 || !strings.Contains(stdout, first+"  running ") {
		t.Errorf("workflow runs: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "workflow", "approve", first, "gate", "--reason", "looks good"); code != 0 ||
		!strings.Contains(stdout, "approved") || !strings.Contains(stdout, "looks good") {
		t.Errorf("workflow approve: %d %s %s", code, stdout, stderr)
	}
	var f result
	select {
	case f = <-followed:
	case <-time.After(2 * time.Minute):
		t.Fatal("launch --follow did not end")
	}
	if f.code != 0 || runID(t, f.stdout) != first || !strings.Contains(f.stdout, "  node gate: waiting (until ") ||
		!strings.Contains(f.stdout, `  node gate: succeeded (approved, by the key `) || !strings.Contains(f.stdout, `: "looks good")`) ||
		!strings.Contains(f.stdout, "  node rollback: skipped") || !strings.HasSuffix(f.stdout, "workflow run "+first+": succeeded\n") {
		t.Errorf("launch --follow: %d %s %s", f.code, f.stdout, f.stderr)
	}
	if _, stderr, code := run(t, env, "workflow", "deny", first, "gate"); code != ExitFailed || !strings.Contains(stderr, "deny gate: HTTP 409") {
		t.Errorf("a second decision: %d %s", code, stderr)
	}
	stdout, stderr, code = run(t, env, "workflow", "launch", wf, "--var", "channel=stable", "--var", "note=a;b", "--idempotency-key", "release-1")
	if code != 0 || runID(t, stdout) != first || !strings.Contains(stdout, "(replayed: ") {
		t.Errorf("the same Idempotency-Key again: %d %s %s", code, stdout, stderr)
	}

	// A deny takes the failure edge: the template's job is launched and
	// ended by a stand-in for infra with artifacts, which run show prints.
	stdout, stderr, code = run(t, env, "workflow", "launch", wf, "--extra-vars", `{"channel":"beta"}`)
	if code != 0 || !strings.Contains(stdout, ": running") {
		t.Fatalf("workflow launch: %d %s %s", code, stdout, stderr)
	}
	second := runID(t, stdout)
	waitNode(t, env, second, "gate", "waiting")
	if stdout, stderr, code := run(t, env, "workflow", "deny", second, "gate", "--reason", "not today"); code != 0 ||
		!strings.Contains(stdout, "denied") || !strings.Contains(stdout, "not today") {
		t.Errorf("workflow deny: %d %s %s", code, stdout, stderr)
	}
	shown = waitNode(t, env, second, "rollback", "running")
	job := finishJob(t, d.rdb, messages.Vars{"rolled_back_to": "1.9"})
	if !strings.Contains(shown, job) {
		t.Errorf("the rollback's job %s is not shown:\n%s", job, shown)
	}
	stdout, stderr, code = run(t, env, "workflow", "run", "follow", second, "--poll", "100ms")
	if code != 0 || !strings.Contains(stdout, "  node rollback: succeeded (job "+job+")") ||
		!strings.HasSuffix(stdout, "workflow run "+second+": succeeded\n") {
		t.Errorf("run follow: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "workflow", "run", "show", second); code != 0 ||
		!strings.Contains(stdout, `{"rolled_back_to":"1.9"}`) || !strings.HasPrefix(strings.Join(nodeRow(stdout, "gate"), " "), "gate failed denied - ") {
		t.Errorf("run show of an ended run: %d %s %s", code, stdout, stderr)
	}

	var ended struct{ ID, Status string }
	stdout, stderr, code = run(t, env, "--json", "workflow", "run", "follow", second)
	if mustJSON(t, stdout, &ended); code != 0 || ended.ID != second || ended.Status != "succeeded" {
		t.Errorf("--json run follow: %d %s %s", code, stdout, stderr)
	}

	// A cancel ends the waiting approval and the run: follow exits 1.
	stdout, stderr, code = run(t, env, "workflow", "launch", wf)
	if code != 0 {
		t.Fatalf("workflow launch: %d %s %s", code, stdout, stderr)
	}
	third := runID(t, stdout)
	if stdout, stderr, code := run(t, env, "workflow", "cancel", third); code != 0 || !strings.Contains(stdout, "workflow run "+third+": cancel") {
		t.Errorf("workflow cancel: %d %s %s", code, stdout, stderr)
	}
	stdout, stderr, code = run(t, env, "workflow", "run", "follow", third, "--poll", "100ms")
	if code != ExitFailed || !strings.Contains(stdout, "  node gate: cancelled") ||
		!strings.HasSuffix(stdout, "workflow run "+third+": cancelled\n") {
		t.Errorf("run follow of a cancelled run: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, env, "workflow", "cancel", third); code != ExitFailed || !strings.Contains(stderr, "cancel the run: HTTP 409") {
		t.Errorf("a cancel of an ended run: %d %s", code, stderr)
	}

	// show --json, edited, is what update takes.
	shown, stderr, code = run(t, env, "--json", "workflow", "show", wf)
	if code != 0 {
		t.Fatalf("workflow show: %d %s", code, stderr)
	}
	edited := strings.Replace(shown, `"ship it?"`, `"ship it now?"`, 1)
	if stdout, stderr, code := runStdin(t, env, strings.NewReader(edited), "workflow", "update", wf, "-"); code != 0 ||
		!strings.Contains(stdout, ": version 2\n") || !strings.Contains(stdout, `"ship it now?"`) {
		t.Errorf("workflow update from stdin: %d %s %s", code, stdout, stderr)
	}

	// Tenancy: another project's key finds nothing.
	other := d.cliEnv(d.key(t, "templates:write,templates:launch", "0c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f"))
	for _, args := range [][]string{{"workflow", "show", wf}, {"workflow", "runs", wf}, {"workflow", "launch", wf},
		{"workflow", "update", wf, file}, {"workflow", "delete", wf}, {"workflow", "run", "show", first},
		{"workflow", "approve", third, "gate"}, {"workflow", "cancel", third}} {
		if _, stderr, code := run(t, other, args...); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
			t.Errorf("%v with another project's key: %d %s", args, code, stderr)
		}
	}
	if stdout, stderr, code := run(t, other, "workflow", "list"); code != 0 || strings.TrimSpace(stdout) != "no workflows" {
		t.Errorf("workflow list with another project's key: %d %s %s", code, stdout, stderr)
	}

	if stdout, stderr, code := run(t, env, "workflow", "delete", wf); code != 0 || stdout != "workflow "+wf+" deleted\n" {
		t.Errorf("workflow delete: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, env, "workflow", "show", wf); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
		t.Errorf("a deleted workflow: %d %s", code, stderr)
	}
	if stdout, stderr, code := run(t, env, "workflow", "list"); code != 0 || strings.TrimSpace(stdout) != "no workflows" {
		t.Errorf("workflow list after the delete: %d %s %s", code, stdout, stderr)
	}
}
