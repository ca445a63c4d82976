package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// Workflows: the list, a workflow (its graph, latest runs and a launch
// form), and a run drawn as its graph with each node's state and job,
// the approvals waiting for a decision, and cancel. Every page and form
// calls the workflows API as the session's key.

func (c *Console) workflowsPage(w http.ResponseWriter, r *http.Request) {
	var list api.WorkflowList
	res, err := c.call(r, http.MethodGet, "/api/v1/workflows", nil, &list)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	c.render(w, r, http.StatusOK, "workflows", map[string]any{"Title": "Workflows", "Items": list.Items})
}

func (c *Console) workflowPage(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	var wf workflows.Workflow
	res, err := c.call(r, http.MethodGet, "/api/v1/workflows/"+url.PathEscape(id), nil, &wf)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	var runs api.WorkflowRunList
	if res, err := c.call(r, http.MethodGet, "/api/v1/workflows/"+url.PathEscape(id)+"/runs", nil, &runs); err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	c.render(w, r, http.StatusOK, "workflow", map[string]any{"Title": "Workflow " + wf.Name, "W": wf,
		"Graph": layoutGraph(wf.Graph, nil), "Runs": runs.Items, "Error": r.URL.Query().Get("error")})
}

func (c *Console) launchWorkflow(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	var l workflows.LaunchRun
	if raw := strings.TrimSpace(r.PostFormValue("extra_vars")); raw != "" {
		if err := json.Unmarshal([]byte(raw), &l.ExtraVars); err != nil {
			http.Redirect(w, r, Prefix+"/workflows/"+url.PathEscape(id)+"?error="+url.QueryEscape("Extra variables must be a JSON object: "+err.Error()), http.StatusSeeOther)
			return
		}
	}
	var run workflows.Run
	res, err := c.call(r, http.MethodPost, "/api/v1/workflows/"+url.PathEscape(id)+"/launch", l, &run)
	if err == nil && res.Problem != nil && res.Status == http.StatusUnprocessableEntity {
		http.Redirect(w, r, Prefix+"/workflows/"+url.PathEscape(id)+"?error="+url.QueryEscape(problemText(res.Problem)), http.StatusSeeOther)
		return
	}
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, Prefix+"/workflow-runs/"+url.PathEscape(run.ID), http.StatusSeeOther)
}

func (c *Console) workflowRunPage(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	var run workflows.Run
	res, err := c.call(r, http.MethodGet, "/api/v1/workflow-runs/"+url.PathEscape(id), nil, &run)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	nodes := map[string]workflows.NodeRun{}
	var waiting []map[string]any
	for _, n := range run.Nodes {
		nodes[n.ID] = n
		if n.Status != workflows.NodeWaiting {
			continue
		}
		for _, gn := range run.Graph.Nodes {
			if gn.ID == n.ID && gn.Approval != nil {
				waiting = append(waiting, map[string]any{"Node": n, "Approval": gn.Approval})
			}
		}
	}
	active := run.Status == workflows.RunRunning || run.Status == workflows.RunCancelling
	data := map[string]any{"Title": "Workflow run " + run.ID, "R": run, "Graph": layoutGraph(run.Graph, nodes),
		"Waiting": waiting, "Active": active, "Done": r.URL.Query().Get("done")}
	c.render(w, r, http.StatusOK, "workflowrun", data)
}

func (c *Console) cancelWorkflowRun(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	res, err := c.call(r, http.MethodPost, "/api/v1/workflow-runs/"+url.PathEscape(id)+"/cancel", nil, nil)
	if err != nil || (res.Problem != nil && res.Status != http.StatusConflict) {
		c.failAPI(w, r, res, err)
		return
	}
	done := "cancel requested"
	if res.Problem != nil {
		done = "already finished"
	}
	http.Redirect(w, r, Prefix+"/workflow-runs/"+url.PathEscape(id)+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

func (c *Console) decideWorkflowNode(w http.ResponseWriter, r *http.Request) {
	id, node, op := chi.URLParam(r, "id"), chi.URLParam(r, "node"), chi.URLParam(r, "op")
	if op != "approve" && op != "deny" {
		c.fail(w, r, http.StatusNotFound, "No such action.")
		return
	}
	path := "/api/v1/workflow-runs/" + url.PathEscape(id) + "/nodes/" + url.PathEscape(node) + "/" + op
	res, err := c.call(r, http.MethodPost, path, api.Decision{Reason: r.PostFormValue("reason")}, nil)
	if err != nil || (res.Problem != nil && res.Status != http.StatusConflict) {
		c.failAPI(w, r, res, err)
		return
	}
	done := map[string]string{"approve": "approved", "deny": "denied"}[op]
	if res.Problem != nil {
		done = "no longer waiting: " + res.Problem.Detail
	}
	http.Redirect(w, r, Prefix+"/workflow-runs/"+url.PathEscape(id)+"?done="+url.QueryEscape(node+" "+done), http.StatusSeeOther)
}

// Graph drawing: nodes in columns by their depth (the longest path from a
// node without parents), edges as lines between them, each node a link to
// its job when it has one. The page lists the same in a table for those
// who do not see the drawing.

const (
	boxW, boxH = 160, 52
	colW, rowH = 220, 80
	margin     = 12
)

type graphBox struct {
	ID, Kind, Status, Outcome, Href, Label string
	X, Y                                   int
}

type graphEdge struct {
	X1, Y1, X2, Y2 int
	On             string
	LX, LY         int // where its label goes
}

type graphView struct {
	Boxes         []graphBox
	Edges         []graphEdge
	Width, Height int
	Label         string // the drawing's text alternative
}

// layoutGraph lays g out; nodes gives each node's state in a run (nil:
// the workflow's definition).
func layoutGraph(g workflows.Graph, nodes map[string]workflows.NodeRun) graphView {
	depth := map[string]int{}
	for range g.Nodes { // longest path: at most len(nodes) relaxations
		for _, e := range g.Edges {
			if d := depth[e.From] + 1; d > depth[e.To] {
				depth[e.To] = d
			}
		}
	}
	rows := map[int]int{}
	pos := map[string][2]int{}
	var v graphView
	var summary []string
	for _, n := range g.Nodes {
		col := depth[n.ID]
		row := rows[col]
		rows[col]++
		x, y := margin+col*colW, margin+row*rowH
		pos[n.ID] = [2]int{x, y}
		b := graphBox{ID: n.ID, X: x, Y: y, Kind: "job", Status: "pending"}
		if n.Approval != nil {
			b.Kind = "approval"
		}
		if nodes != nil {
			nr := nodes[n.ID]
			b.Status, b.Outcome = nr.Status, nr.Outcome
			if nr.JobID != "" {
				b.Href = Prefix + "/runs/job/" + url.PathEscape(nr.JobID)
			}
		} else {
			b.Status = ""
		}
		b.Label = n.ID
		if b.Status != "" {
			b.Label += ": " + b.Status
		}
		summary = append(summary, b.Label)
		v.Boxes = append(v.Boxes, b)
		v.Width = max(v.Width, x+boxW+margin)
		v.Height = max(v.Height, y+boxH+margin)
	}
	for _, e := range g.Edges {
		a, b := pos[e.From], pos[e.To]
		ge := graphEdge{X1: a[0] + boxW, Y1: a[1] + boxH/2, X2: b[0], Y2: b[1] + boxH/2, On: e.On}
		if b[0] <= a[0] { // same column or back: go around below
			ge.X1, ge.Y1, ge.X2, ge.Y2 = a[0]+boxW/2, a[1]+boxH, b[0]+boxW/2, b[1]
		}
		ge.LX, ge.LY = (ge.X1+ge.X2)/2, (ge.Y1+ge.Y2)/2-4
		v.Edges = append(v.Edges, ge)
	}
	slices.SortStableFunc(v.Edges, func(a, b graphEdge) int { return strings.Compare(a.On, b.On) })
	v.Label = fmt.Sprintf("A graph of %d nodes (%s) and %d edges.", len(g.Nodes), strings.Join(summary, ", "), len(g.Edges))
	return v
}
