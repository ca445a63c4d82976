package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// workflowCmd is `autoprov workflow`: the workflows of the API key's
// projects (templates in a graph, with approvals) and their runs, through
// the deployer's API (/api/v1/workflows, /api/v1/workflow-runs). A
// workflow is given as the JSON body of POST /api/v1/workflows; `workflow
// show --json` prints one in a form `workflow update` takes back.
type workflowCmd struct {
	List    workflowListCmd    `cmd:"" help:"the workflows of the key's projects"`
	Show    workflowShowCmd    `cmd:"" help:"a workflow's graph: its nodes, what each does, its edges"`
	Create  workflowCreateCmd  `cmd:"" help:"create a workflow (the JSON body of POST /api/v1/workflows, from a file or - for stdin)"`
	Update  workflowUpdateCmd  `cmd:"" help:"replace a workflow's graph from a file (what workflow show --json prints, edited): its next version; runs started keep theirs"`
	Delete  workflowDeleteCmd  `cmd:"" help:"delete a workflow with its runs' records (their jobs stay)"`
	Launch  workflowLaunchCmd  `cmd:"" help:"start a run of a workflow; --follow prints its nodes' changes and exits with its status (0 succeeded, 1 otherwise)"`
	Runs    workflowRunsCmd    `cmd:"" help:"a workflow's latest runs, newest first"`
	Run     workflowRunCmd     `cmd:"" help:"a run: show (each node's status, outcome, job, artifacts, an approval's deadline), follow"`
	Approve workflowApproveCmd `cmd:"" help:"approve a run's waiting approval node: the edges on its success are taken"`
	Deny    workflowDenyCmd    `cmd:"" help:"deny a run's waiting approval node: it fails (outcome denied), the edges on its failure are taken"`
	Cancel  workflowCancelCmd  `cmd:"" help:"cancel a run: its running jobs are cancelled, waiting approvals and nodes not started end cancelled"`
}

// workflowRunCmd is `autoprov workflow run`: one run.
type workflowRunCmd struct {
	Show   workflowRunShowCmd   `cmd:"" help:"a run: each node's status, outcome, job, artifacts, an approval's deadline or decision"`
	Follow workflowRunFollowCmd `cmd:"" help:"print a run's node changes until it ends, and exit with its status (0 succeeded, 1 otherwise)"`
}

// apiGraph is what autoprov reads of a workflow's graph.
type apiGraph struct {
	Nodes []struct {
		ID         string          `json:"id"`
		TemplateID string          `json:"template_id"`
		Launch     json.RawMessage `json:"launch"`
		Approval   *struct {
			Description    string   `json:"description"`
			Approvers      []string `json:"approvers"`
			TimeoutSeconds int      `json:"timeout_seconds"`
		} `json:"approval"`
	} `json:"nodes"`
	Edges []struct {
		From string `json:"from"`
		To   string `json:"to"`
		On   string `json:"on"`
	} `json:"edges"`
}

// apiWorkflow is what autoprov reads of a workflow.
type apiWorkflow struct {
	ID          string `json:"id"`
	ProjectID   string `json:"project_id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	apiGraph
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// apiNodeRun is what autoprov reads of a node of a run.
type apiNodeRun struct {
	ID         string          `json:"id"`
	Status     string          `json:"status"`
	Outcome    string          `json:"outcome"`
	JobID      string          `json:"job_id"`
	Artifacts  json.RawMessage `json:"artifacts"`
	Deadline   *time.Time      `json:"deadline"`
	DecidedBy  string          `json:"decided_by"`
	Reason     string          `json:"reason"`
	Error      string          `json:"error"`
	StartedAt  *time.Time      `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at"`
}

// apiWorkflowRun is what autoprov reads of a run.
type apiWorkflowRun struct {
	ID         string          `json:"id"`
	WorkflowID string          `json:"workflow_id"`
	ProjectID  string          `json:"project_id"`
	Version    int             `json:"version"`
	ExtraVars  json.RawMessage `json:"extra_vars"`
	Status     string          `json:"status"`
	Error      string          `json:"error"`
	Nodes      []apiNodeRun    `json:"nodes"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt *time.Time      `json:"finished_at"`
}

// workflowPath is the API's path of workflow id.
func workflowPath(id string) string { return "/api/v1/workflows/" + url.PathEscape(id) }

// workflowRunPath is the API's path of run id.
func workflowRunPath(id string) string { return "/api/v1/workflow-runs/" + url.PathEscape(id) }

// ended reports whether the run is over (succeeded, failed, cancelled).
func (r *apiWorkflowRun) ended() bool {
	return r.Status != "running" && r.Status != "cancelling"
}

// does says what node k of the graph does.
func (gr *apiGraph) does(k int) string {
	n := gr.Nodes[k]
	if a := n.Approval; a != nil {
		out := "waits for an approval"
		if a.Description != "" {
			out += " (" + strconv.Quote(a.Description) + ")"
		}
		if len(a.Approvers) > 0 {
			out += " by the key " + strings.Join(a.Approvers, " or ")
		} else {
			out += " by a key of the project with templates:launch"
		}
		timeout := time.Hour
		if a.TimeoutSeconds > 0 {
			timeout = time.Duration(a.TimeoutSeconds) * time.Second
		}
		return out + ", for at most " + timeout.String()
	}
	out := "launches the template " + n.TemplateID
	if len(n.Launch) > 0 && string(n.Launch) != "null" && string(n.Launch) != "{}" {
		out += " with " + compactJSON(n.Launch)
	}
	return out
}

// starts lists the nodes no edge leads to: those a run starts with.
func (gr *apiGraph) starts() string {
	into := map[string]bool{}
	for _, e := range gr.Edges {
		into[e.To] = true
	}
	var list []string
	for _, n := range gr.Nodes {
		if !into[n.ID] {
			list = append(list, n.ID)
		}
	}
	return strings.Join(list, ", ")
}

// compactJSON is raw on one line.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// showWorkflow prints a workflow: its graph as text.
func (g *globals) showWorkflow(_ *apiClient, raw json.RawMessage) error {
	if g.json {
		return g.writeRaw(raw)
	}
	var wf apiWorkflow
	if err := json.Unmarshal(raw, &wf); err != nil {
		return err
	}
	w := g.env.Stdout
	fmt.Fprintf(w, "workflow %s %s: version %d\n", oneLine(wf.Name), wf.ID, wf.Version)
	fmt.Fprintf(w, "  project: %s\n", wf.ProjectID)
	fmt.Fprintf(w, "  saved: %s (created %s)\n", when(wf.UpdatedAt), when(wf.CreatedAt))
	if wf.Description != "" {
		fmt.Fprintf(w, "  description: %s\n", oneLine(wf.Description))
	}
	fmt.Fprintf(w, "  a run starts with: %s\n", oneLine(wf.starts()))
	// A node's line is not cut as a table's cells are: what it does is
	// the point.
	fmt.Fprintln(w, "  nodes:")
	width := 0
	for _, n := range wf.Nodes {
		width = max(width, len(printable(n.ID)))
	}
	for k, n := range wf.Nodes {
		fmt.Fprintf(w, "    %-*s  %s\n", width, printable(n.ID), printable(wf.does(k)))
	}
	if len(wf.Edges) == 0 {
		fmt.Fprintln(w, "  edges: none")
		return nil
	}
	fmt.Fprintln(w, "  edges:")
	for _, e := range wf.Edges {
		fmt.Fprintf(w, "    %s -> %s on %s\n", oneLine(e.From), oneLine(e.To), oneLine(e.On))
	}
	return nil
}

// state says where node n of a run is, on one line: its status with its
// outcome, job, deadline, decision or error.
func (n *apiNodeRun) state() string {
	var more []string
	if n.Outcome != "" && n.Outcome != n.Status {
		more = append(more, n.Outcome)
	}
	if n.JobID != "" {
		more = append(more, "job "+n.JobID)
	}
	if n.Status == "waiting" && n.Deadline != nil {
		more = append(more, "until "+when(*n.Deadline))
	}
	if n.DecidedBy != "" {
		d := "by the key " + n.DecidedBy
		if n.Reason != "" {
			d += ": " + strconv.Quote(n.Reason)
		}
		more = append(more, d)
	}
	if n.Error != "" {
		more = append(more, n.Error)
	}
	if len(more) == 0 {
		return n.Status
	}
	return n.Status + " (" + strings.Join(more, ", ") + ")"
}

// showRun prints a run: its status, then a row for each node.
func (g *globals) showRun(_ *apiClient, raw json.RawMessage) error {
	if g.json {
		return g.writeRaw(raw)
	}
	var r apiWorkflowRun
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	w := g.env.Stdout
	g.runHeader(&r)
	fmt.Fprintf(w, "  workflow: %s (version %d)\n", r.WorkflowID, r.Version)
	fmt.Fprintf(w, "  started: %s\n", when(r.CreatedAt))
	if r.FinishedAt != nil {
		fmt.Fprintf(w, "  finished: %s\n", when(*r.FinishedAt))
	}
	if len(r.ExtraVars) > 0 && string(r.ExtraVars) != "null" {
		fmt.Fprintf(w, "  extra vars: %s\n", oneLine(compactJSON(r.ExtraVars)))
	}
	t := newTable(w, "  NODE", "STATUS", "OUTCOME", "JOB", "ARTIFACTS", "DEADLINE", "DECIDED BY", "REASON", "ERROR")
	for _, n := range r.Nodes {
		artifacts, deadline := "-", "-"
		if len(n.Artifacts) > 0 && string(n.Artifacts) != "null" {
			artifacts = compactJSON(n.Artifacts)
		}
		if n.Status == "waiting" && n.Deadline != nil {
			deadline = when(*n.Deadline)
		}
		t.row("  "+n.ID, n.Status, dash(n.Outcome), dash(n.JobID), artifacts, deadline, dash(n.DecidedBy), dash(n.Reason), dash(n.Error))
	}
	return t.flush()
}

// runHeader prints a run's first line: its id, status and error.
func (g *globals) runHeader(r *apiWorkflowRun) {
	line := fmt.Sprintf("workflow run %s: %s", r.ID, r.Status)
	if r.Error != "" && r.Error != r.Status { // a cancelled run's error is "cancelled"
		line += ": " + oneLine(r.Error)
	}
	fmt.Fprintln(g.env.Stdout, line)
}

// dash is s, or - for nothing.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type workflowListCmd struct{}

func (c *workflowListCmd) Run(g *globals) error {
	return listItems(g, "/api/v1/workflows", "workflows", []string{"ID", "NAME", "VERSION", "NODES", "SAVED", "PROJECT", "DESCRIPTION"},
		func(_ *apiClient, wf *apiWorkflow) []string {
			return []string{wf.ID, wf.Name, strconv.Itoa(wf.Version), strconv.Itoa(len(wf.Nodes)), when(wf.UpdatedAt), wf.ProjectID, wf.Description}
		})
}

type workflowShowCmd struct {
	ID string `arg:"" name:"id" help:"the workflow's id"`
}

func (c *workflowShowCmd) Run(g *globals) error {
	return g.answer(http.MethodGet, workflowPath(c.ID), nil, "show the workflow", g.showWorkflow)
}

type workflowCreateCmd struct {
	File string `arg:"" name:"file" help:"the workflow as JSON (name, description, nodes, edges; see SaveWorkflow in the OpenAPI document), or - to read it from stdin"`
}

func (c *workflowCreateCmd) Run(g *globals) error {
	body, err := g.readInput(c.File, "workflow")
	if err != nil {
		return err
	}
	return g.answer(http.MethodPost, "/api/v1/workflows", body, "create the workflow", g.showWorkflow)
}

type workflowUpdateCmd struct {
	ID   string `arg:"" name:"id" help:"the workflow's id"`
	File string `arg:"" name:"file" help:"the workflow as JSON (what workflow show --json prints, or the body of PUT /api/v1/workflows/{id}), or - to read it from stdin"`
}

// workflowShown are the members of a shown workflow that are not its
// definition: update drops them.
var workflowShown = []string{"id", "version", "created_at", "updated_at"}

func (c *workflowUpdateCmd) Run(g *globals) error {
	data, err := g.readShown(c.File, "workflow", workflowShown...)
	if err != nil {
		return err
	}
	return g.answer(http.MethodPut, workflowPath(c.ID), data, "update the workflow", g.showWorkflow)
}

type workflowDeleteCmd struct {
	ID string `arg:"" name:"id" help:"the workflow's id"`
}

func (c *workflowDeleteCmd) Run(g *globals) error {
	return g.deleteThing(workflowPath(c.ID), "workflow", c.ID)
}

// followFlags are how a run is followed: workflow launch --follow and
// workflow run follow.
type followFlags struct {
	Timeout time.Duration `default:"1h" help:"when following: give up after this long (exit 1; the run goes on)"`
	Poll    time.Duration `default:"1s" help:"when following: how often the run is read (at least 100ms)"`
}

type workflowLaunchCmd struct {
	ID          string            `arg:"" name:"id" help:"the workflow's id"`
	Vars        map[string]string `name:"var" xor:"vars" mapsep:"none" help:"an extra var of every job node, name=value (a string, ; and all); repeatable"`
	ExtraVars   string            `name:"extra-vars" xor:"vars" help:"the extra vars of every job node as a JSON object (above each node's launch, below artifacts and survey answers)"`
	Key         string            `name:"idempotency-key" help:"an Idempotency-Key: the same key with the same extra vars is the same run (safe retries)"`
	Follow      bool              `help:"print the run's node changes until it ends, and exit with its status (0 succeeded, 1 otherwise)"`
	followFlags `embed:""`
}

func (c *workflowLaunchCmd) Run(g *globals) error {
	launch := map[string]any{}
	switch {
	case c.ExtraVars != "":
		var vars map[string]any
		if err := json.Unmarshal([]byte(c.ExtraVars), &vars); err != nil || vars == nil {
			return usageError{errors.New("--extra-vars is not a JSON object")}
		}
		launch["extra_vars"] = vars
	case len(c.Vars) > 0:
		launch["extra_vars"] = c.Vars
	}
	body, err := json.Marshal(launch)
	if err != nil {
		return err
	}
	api, err := g.api()
	if err != nil {
		return err
	}
	hdr := map[string]string{}
	if c.Key != "" {
		hdr["Idempotency-Key"] = c.Key
	}
	var raw json.RawMessage
	resp, err := api.do(g.ctx, http.MethodPost, workflowPath(c.ID)+"/launch", body, hdr, &raw)
	if err != nil {
		return fmt.Errorf("launch the workflow: %w", err)
	}
	replayed := resp.Header.Get("Idempotent-Replayed") == "true"
	if !c.Follow {
		if err := g.showRun(api, raw); err != nil || g.json || !replayed {
			return err
		}
		fmt.Fprintln(g.env.Stdout, "(replayed: the run this Idempotency-Key started before)")
		return nil
	}
	var r apiWorkflowRun
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	if !g.json {
		what := "started"
		if replayed {
			what = "replayed (this Idempotency-Key started it before)"
		}
		fmt.Fprintf(g.env.Stdout, "workflow run %s %s\n", r.ID, what)
	}
	return followRun(g, api, r.ID, c.followFlags)
}

type workflowRunsCmd struct {
	ID string `arg:"" name:"id" help:"the workflow's id"`
}

func (c *workflowRunsCmd) Run(g *globals) error {
	return listItems(g, workflowPath(c.ID)+"/runs", "runs", []string{"ID", "STATUS", "VERSION", "STARTED", "FINISHED", "ERROR"},
		func(_ *apiClient, r *apiWorkflowRun) []string {
			finished := "-"
			if r.FinishedAt != nil {
				finished = when(*r.FinishedAt)
			}
			return []string{r.ID, r.Status, strconv.Itoa(r.Version), when(r.CreatedAt), finished, dash(r.Error)}
		})
}

type workflowRunShowCmd struct {
	ID string `arg:"" name:"run" help:"the run's id"`
}

func (c *workflowRunShowCmd) Run(g *globals) error {
	return g.answer(http.MethodGet, workflowRunPath(c.ID), nil, "show the run", g.showRun)
}

type workflowRunFollowCmd struct {
	ID          string `arg:"" name:"run" help:"the run's id"`
	followFlags `embed:""`
}

func (c *workflowRunFollowCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	return followRun(g, api, c.ID, c.followFlags)
}

// followRun reads run id every f.Poll (100ms at least), printing each node whose state
// changed (one line: `node ID: STATE`; a node still pending is not), until
// the run ends; then prints its last line (--json: the run, and nothing
// before) and exits with its status: nil when it succeeded.
func followRun(g *globals, api *apiClient, id string, f followFlags) error {
	ctx, cancel := context.WithTimeout(g.ctx, f.Timeout)
	defer cancel()
	poll := max(f.Poll, 100*time.Millisecond)
	seen := map[string]string{}
	for attempt := 0; ; attempt++ {
		var r apiWorkflowRun
		raw, err := api.call(ctx, http.MethodGet, workflowRunPath(id), nil, &r)
		var ae *apiError
		switch {
		case err == nil:
			attempt = 0
			if !g.json {
				for _, n := range r.Nodes {
					st := n.state()
					last, ok := seen[n.ID]
					seen[n.ID] = st
					if st != last && (ok || n.Status != "pending") {
						fmt.Fprintf(g.env.Stdout, "  node %s: %s\n", printable(n.ID), printable(st))
					}
				}
			}
			if r.ended() {
				if g.json {
					if err := g.writeRaw(raw); err != nil {
						return err
					}
				} else {
					g.runHeader(&r)
				}
				if r.Status != "succeeded" {
					return &problemsFound{n: 1}
				}
				return nil
			}
		case ctx.Err() != nil:
			return fmt.Errorf("follow the run %s: gave up after %s (it goes on: workflow run show, workflow cancel)", id, f.Timeout)
		case errors.As(err, &ae) && ae.Status < 500 && ae.Status != http.StatusTooManyRequests:
			return fmt.Errorf("follow the run %s: %w", id, err)
		case attempt >= 30:
			return fmt.Errorf("follow the run %s: %w", id, err)
		}
		// Not over yet; or the deployer restarted, or the connection
		// dropped: read it again.
		select {
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
}

// decision is an approval's approve or deny.
type decision struct {
	Run    string `arg:"" name:"run" help:"the run's id"`
	Node   string `arg:"" name:"node" help:"the approval node's id"`
	Reason string `name:"reason" help:"why, recorded with the decision and its key"`
}

// decide POSTs the decision (verb: approve or deny) and shows the run.
func (d *decision) decide(g *globals, verb string) error {
	body, err := json.Marshal(map[string]string{"reason": d.Reason})
	if err != nil {
		return err
	}
	path := workflowRunPath(d.Run) + "/nodes/" + url.PathEscape(d.Node) + "/" + verb
	return g.answer(http.MethodPost, path, body, verb+" "+d.Node, g.showRun)
}

type workflowApproveCmd struct {
	decision `embed:""`
}

func (c *workflowApproveCmd) Run(g *globals) error { return c.decide(g, "approve") }

type workflowDenyCmd struct {
	decision `embed:""`
}

func (c *workflowDenyCmd) Run(g *globals) error { return c.decide(g, "deny") }

type workflowCancelCmd struct {
	ID string `arg:"" name:"run" help:"the run's id"`
}

func (c *workflowCancelCmd) Run(g *globals) error {
	return g.answer(http.MethodPost, workflowRunPath(c.ID)+"/cancel", nil, "cancel the run", g.showRun)
}
