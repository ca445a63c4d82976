// Package workflows holds a project's workflows (issue 36): templates of
// job templates in a graph. A node launches a template or waits for an
// approval; an edge leads from one node to another on its success, on its
// failure, or always. A run starts the nodes without parents; a node whose
// parents are all done runs when one of the edges into it was taken, and
// is skipped otherwise. A job node's artifacts (its set_stats data) reach
// the job nodes after it as extra vars. The Engine advances runs; the API
// launches, approves, denies and cancels them. A key sees only its
// projects' workflows: another project's answer as unknown ones.
package workflows

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// Limits of a workflow's graph.
const (
	MaxNodes = 50
	MaxEdges = 200
	// MaxApprovalTimeout bounds how long an approval may wait.
	MaxApprovalTimeout = 30 * 24 * time.Hour
)

// When an edge is taken.
const (
	OnSuccess = "success"
	OnFailure = "failure"
	OnAlways  = "always"
)

// Node is a step of a workflow: a template's launch, or an approval.
type Node struct {
	// ID names the node in the graph: [A-Za-z0-9_-]{1,64}.
	ID string `json:"id"`
	// TemplateID and Launch: the job template the node launches, with
	// its launch (overrides and survey answers; no secret answer).
	TemplateID string            `json:"template_id,omitempty"`
	Launch     *templates.Launch `json:"launch,omitempty"`
	// Approval makes the node wait for a person's decision instead.
	Approval *Approval `json:"approval,omitempty"`
}

// Approval is a node that waits until it is approved (success), denied or
// timed out (failure).
type Approval struct {
	// Description tells the approver what is asked.
	Description string `json:"description,omitempty"`
	// Approvers are the API keys that may decide (by id); none: any key
	// of the project with templates:launch.
	Approvers []string `json:"approvers,omitempty"`
	// TimeoutSeconds is how long the node waits (default 1 hour).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// Timeout is how long the approval waits.
func (a *Approval) Timeout() time.Duration {
	if a.TimeoutSeconds <= 0 {
		return time.Hour
	}
	return time.Duration(a.TimeoutSeconds) * time.Second
}

// Edge leads from one node to another, taken when From ends as On says.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
	On   string `json:"on"`
}

// Graph is a workflow's nodes and edges.
type Graph struct {
	Nodes []Node `json:"nodes"`
	Edges []Edge `json:"edges,omitempty"`
}

// Workflow is a stored workflow.
type Workflow struct {
	ID          string `json:"id"`
	ProjectID   string `json:"project_id"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Graph
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Save is a workflow to create or the new state of one.
type Save struct {
	ProjectID   string `json:"project_id,omitempty"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Graph
}

// Errors of the service.
var (
	ErrNotFound = errors.New("no workflow has this id")
	ErrExists   = errors.New("a workflow of this name exists in the project")
)

// Templates reads the job templates a node names (templates.Service).
type Templates interface {
	Get(ctx context.Context, v deployments.Visibility, id string, version int) (*templates.Template, error)
	Launch(ctx context.Context, sub templates.Submitter, keyID string, v deployments.Visibility, id string, l templates.Launch, idempotencyKey string) (*deployments.Submission, error)
}

// Service stores workflows and their runs.
type Service struct {
	db        *pgxpool.Pool
	templates Templates
	now       func() time.Time
	// wake, when set, is called after a change an Engine should act on
	// at once (a launch, a decision, a cancel).
	wake func()
}

// NewService returns the workflows of db, whose nodes launch templates.
func NewService(db *pgxpool.Pool, t Templates) *Service {
	return &Service{db: db, templates: t, now: time.Now}
}

// OnChange sets the function called after a launch, decision or cancel
// (an Engine's Wake).
func (s *Service) OnChange(f func()) { s.wake = f }

func (s *Service) changed() {
	if s.wake != nil {
		s.wake()
	}
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	nodeIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

func invalid(fields ...deployments.FieldError) error {
	return &deployments.InvalidError{Fields: fields}
}

func field(name, msg string) deployments.FieldError {
	return deployments.FieldError{Field: name, Message: msg}
}

// check validates sv as v sees it: names, the graph's shape (no cycle,
// every edge between known nodes), every template of the project, and
// every node's launch against its template.
func (s *Service) check(ctx context.Context, v deployments.Visibility, sv *Save) error {
	var bad []deployments.FieldError
	if !nameRE.MatchString(sv.Name) {
		bad = append(bad, field("name", "must match "+nameRE.String()))
	}
	if len(sv.Description) > 1000 {
		bad = append(bad, field("description", "at most 1000 characters"))
	}
	switch {
	case len(sv.Nodes) == 0:
		bad = append(bad, field("nodes", "a workflow needs a node"))
	case len(sv.Nodes) > MaxNodes:
		bad = append(bad, field("nodes", fmt.Sprintf("at most %d nodes", MaxNodes)))
	}
	if len(sv.Edges) > MaxEdges {
		bad = append(bad, field("edges", fmt.Sprintf("at most %d edges", MaxEdges)))
	}
	seen := map[string]bool{}
	for i, n := range sv.Nodes {
		f := "nodes[" + strconv.Itoa(i) + "]"
		switch {
		case !nodeIDRE.MatchString(n.ID):
			bad = append(bad, field(f+".id", "must match "+nodeIDRE.String()))
		case seen[n.ID]:
			bad = append(bad, field(f+".id", "another node has this id"))
		}
		seen[n.ID] = true
		switch {
		case (n.TemplateID == "") == (n.Approval == nil):
			bad = append(bad, field(f, "a node has either template_id or approval"))
		case n.Approval != nil:
			a := n.Approval
			if n.Launch != nil {
				bad = append(bad, field(f+".launch", "an approval launches nothing"))
			}
			if a.TimeoutSeconds < 0 || time.Duration(a.TimeoutSeconds)*time.Second > MaxApprovalTimeout {
				bad = append(bad, field(f+".approval.timeout_seconds", "between 0 (1 hour) and 30 days"))
			}
			if len(a.Description) > 1000 {
				bad = append(bad, field(f+".approval.description", "at most 1000 characters"))
			}
			for j, k := range a.Approvers {
				if _, err := uuid.Parse(k); err != nil {
					bad = append(bad, field(f+".approval.approvers["+strconv.Itoa(j)+"]", "must be an API key id"))
				}
			}
		default:
			t, err := s.templates.Get(ctx, v, n.TemplateID, 0)
			switch {
			case errors.Is(err, templates.ErrNotFound):
				bad = append(bad, field(f+".template_id", "no template of yours has this id"))
				continue
			case err != nil:
				return err
			case t.ProjectID != sv.ProjectID:
				bad = append(bad, field(f+".template_id", "the template is of another project"))
				continue
			}
			if n.Launch != nil {
				if err := templates.CheckStoredLaunch(t, *n.Launch, "workflow", func(name, msg string) {
					bad = append(bad, field(f+"."+name, msg))
				}); err != nil {
					return err
				}
			}
		}
	}
	for i, e := range sv.Edges {
		f := "edges[" + strconv.Itoa(i) + "]"
		if !seen[e.From] {
			bad = append(bad, field(f+".from", "no node has this id"))
		}
		if !seen[e.To] {
			bad = append(bad, field(f+".to", "no node has this id"))
		}
		if e.On != OnSuccess && e.On != OnFailure && e.On != OnAlways {
			bad = append(bad, field(f+".on", "one of success, failure, always"))
		}
	}
	if len(bad) == 0 {
		if cycle := sv.Graph.cycle(); cycle != "" {
			bad = append(bad, field("edges", "the graph has a cycle through node "+cycle))
		}
	}
	if len(bad) > 0 {
		return invalid(bad...)
	}
	return nil
}

// cycle names a node on a cycle of g, or "" when g has none (Kahn's
// algorithm: what is left when no node without parents remains).
func (g *Graph) cycle() string {
	in := map[string]int{}
	for _, e := range g.Edges {
		in[e.To]++
	}
	var ready []string
	for _, n := range g.Nodes {
		if in[n.ID] == 0 {
			ready = append(ready, n.ID)
		}
	}
	done := 0
	for len(ready) > 0 {
		id := ready[0]
		ready = ready[1:]
		done++
		for _, e := range g.Edges {
			if e.From == id {
				if in[e.To]--; in[e.To] == 0 {
					ready = append(ready, e.To)
				}
			}
		}
	}
	if done == len(g.Nodes) {
		return ""
	}
	for _, n := range g.Nodes {
		if in[n.ID] > 0 {
			return n.ID
		}
	}
	return ""
}

// node returns the node id of g.
func (g *Graph) node(id string) *Node {
	for i := range g.Nodes {
		if g.Nodes[i].ID == id {
			return &g.Nodes[i]
		}
	}
	return nil
}

// Create stores a new workflow of project sv.ProjectID, which v must see.
func (s *Service) Create(ctx context.Context, v deployments.Visibility, sv Save) (*Workflow, error) {
	p, ok := messages.CanonicalProjectID(sv.ProjectID)
	if !ok {
		return nil, invalid(field("project_id", "must be a project id (a UUID)"))
	}
	sv.ProjectID = p
	if !v.Holds(p) {
		return nil, deployments.ErrForbiddenProject
	}
	if err := s.check(ctx, v, &sv); err != nil {
		return nil, err
	}
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, err
	}
	graph, err := json.Marshal(sv.Graph)
	if err != nil {
		return nil, err
	}
	_, err = s.db.Exec(ctx, `INSERT INTO workflows (id, project_id, name, description, graph) VALUES ($1, $2, $3, $4, $5)`,
		id, p, sv.Name, sv.Description, graph)
	if isUnique(err) {
		return nil, ErrExists
	}
	if err != nil {
		return nil, fmt.Errorf("store workflow: %w", err)
	}
	return s.Get(ctx, v, id.String())
}

// Update replaces the workflow id's name, description and graph (runs
// started keep theirs) and bumps its version.
func (s *Service) Update(ctx context.Context, v deployments.Visibility, id string, sv Save) (*Workflow, error) {
	w, err := s.Get(ctx, v, id)
	if err != nil {
		return nil, err
	}
	sv.ProjectID = w.ProjectID
	if err := s.check(ctx, v, &sv); err != nil {
		return nil, err
	}
	graph, err := json.Marshal(sv.Graph)
	if err != nil {
		return nil, err
	}
	_, err = s.db.Exec(ctx, `UPDATE workflows SET name = $2, description = $3, graph = $4, version = version + 1, updated_at = now()
		WHERE id = $1`, w.ID, sv.Name, sv.Description, graph)
	if isUnique(err) {
		return nil, ErrExists
	}
	if err != nil {
		return nil, fmt.Errorf("update workflow: %w", err)
	}
	return s.Get(ctx, v, id)
}

const workflowColumns = `id::text, project_id, name, description, graph, version, created_at, updated_at`

func scanWorkflow(row pgx.Row) (*Workflow, error) {
	var w Workflow
	var graph []byte
	if err := row.Scan(&w.ID, &w.ProjectID, &w.Name, &w.Description, &graph, &w.Version, &w.CreatedAt, &w.UpdatedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(graph, &w.Graph); err != nil {
		return nil, fmt.Errorf("workflow %s: graph: %w", w.ID, err)
	}
	return &w, nil
}

// Get returns the workflow id, when v sees its project.
func (s *Service) Get(ctx context.Context, v deployments.Visibility, id string) (*Workflow, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	w, err := scanWorkflow(s.db.QueryRow(ctx, `SELECT `+workflowColumns+` FROM workflows WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read workflow: %w", err)
	}
	if !v.Holds(w.ProjectID) {
		return nil, ErrNotFound
	}
	return w, nil
}

// List returns the workflows v sees, by project and name.
func (s *Service) List(ctx context.Context, v deployments.Visibility) ([]*Workflow, error) {
	var projects []string
	if !v.All {
		projects = append([]string{}, v.Projects...)
	}
	rows, err := s.db.Query(ctx, `SELECT `+workflowColumns+` FROM workflows
		WHERE $1::text[] IS NULL OR project_id = ANY($1) ORDER BY project_id, name LIMIT 1000`, projects)
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Workflow, error) { return scanWorkflow(r) })
}

// Delete removes the workflow id and its runs' records (running jobs go
// on: cancel the runs first to stop them).
func (s *Service) Delete(ctx context.Context, v deployments.Visibility, id string) error {
	w, err := s.Get(ctx, v, id)
	if err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM workflows WHERE id = $1`, w.ID); err != nil {
		return fmt.Errorf("delete workflow: %w", err)
	}
	return nil
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
