package workflows

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Run statuses.
const (
	RunRunning    = "running"
	RunCancelling = "cancelling"
	RunSucceeded  = "succeeded"
	RunFailed     = "failed"
	RunCancelled  = "cancelled"
)

// Node statuses.
const (
	NodePending   = "pending"
	NodeRunning   = "running" // a job node's job runs
	NodeWaiting   = "waiting" // an approval waits for its decision
	NodeSucceeded = "succeeded"
	NodeFailed    = "failed"
	NodeSkipped   = "skipped" // no edge into it was taken
	NodeCancelled = "cancelled"
)

// Outcomes of approval nodes.
const (
	OutcomeApproved = "approved"
	OutcomeDenied   = "denied"
	OutcomeTimedOut = "timed_out"
)

// Run is a launch of a workflow.
type Run struct {
	ID         string `json:"id"`
	WorkflowID string `json:"workflow_id"`
	ProjectID  string `json:"project_id"`
	// Version is the workflow's version the run started with; Graph is
	// that version's graph.
	Version   int            `json:"version"`
	Graph     Graph          `json:"graph"`
	ExtraVars map[string]any `json:"extra_vars,omitempty"`
	// Status: running, cancelling, then succeeded, failed or cancelled.
	Status     string     `json:"status"`
	Error      string     `json:"error,omitempty"`
	Nodes      []NodeRun  `json:"nodes"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Replayed: an Idempotency-Key matched an earlier launch.
	Replayed bool `json:"-"`
}

// NodeRun is a node of a run.
type NodeRun struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// Outcome is why it ended so: its job's status, or approved, denied,
	// timed_out.
	Outcome   string         `json:"outcome,omitempty"`
	JobID     string         `json:"job_id,omitempty"`
	Artifacts map[string]any `json:"artifacts,omitempty"`
	// Deadline is when a waiting approval times out.
	Deadline *time.Time `json:"deadline,omitempty"`
	// DecidedBy is the API key that approved or denied, with its reason.
	DecidedBy  string     `json:"decided_by,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// done reports whether the node has ended.
func (n *NodeRun) done() bool {
	switch n.Status {
	case NodeSucceeded, NodeFailed, NodeSkipped, NodeCancelled:
		return true
	}
	return false
}

// LaunchRun is what a workflow's launch gives.
type LaunchRun struct {
	// ExtraVars reach every job node (above each node's launch, below
	// artifacts and survey answers).
	ExtraVars map[string]any `json:"extra_vars,omitempty"`
}

// varNameRE is the wire contract's rule for a variable name.
var varNameRE = regexp.MustCompile(messages.VarNamePattern)

// Launch starts a run of workflow id for the API key keyID (which sees v
// and must hold templates:launch: the run launches its jobs as it). An
// idempotencyKey used before replays that run (Replayed), or is
// ErrIdempotencyMismatch with other extra vars.
func (s *Service) Launch(ctx context.Context, keyID string, v deployments.Visibility, id string, l LaunchRun, idempotencyKey string) (*Run, error) {
	w, err := s.Get(ctx, v, id)
	if err != nil {
		return nil, err
	}
	var bad []deployments.FieldError
	for name := range l.ExtraVars {
		if !varNameRE.MatchString(name) || strings.HasPrefix(strings.ToLower(name), "ansible_") {
			bad = append(bad, field("extra_vars["+name+"]", "must be a variable name, not ansible_*"))
		}
	}
	if len(idempotencyKey) > 255 {
		bad = append(bad, field("Idempotency-Key", "at most 255 characters"))
	}
	if len(bad) > 0 {
		return nil, invalid(bad...)
	}
	if l.ExtraVars == nil {
		l.ExtraVars = map[string]any{}
	}
	vars, err := json.Marshal(l.ExtraVars)
	if err != nil {
		return nil, invalid(field("extra_vars", "must be JSON data"))
	}
	graph, err := json.Marshal(w.Graph)
	if err != nil {
		return nil, err
	}
	runID, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, err
	}
	var idem *string
	if idempotencyKey != "" {
		idem = &idempotencyKey
	}
	inserted := false
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO workflow_runs (id, workflow_id, project_id, version, graph, extra_vars, api_key_id, idempotency_key, status)
			VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, '')::uuid, $8, 'running') ON CONFLICT (workflow_id, idempotency_key) DO NOTHING`,
			runID, w.ID, w.ProjectID, w.Version, graph, vars, keyID, idem)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		inserted = true
		nodes := make([]string, len(w.Nodes))
		for i, n := range w.Nodes {
			nodes[i] = n.ID
		}
		_, err = tx.Exec(ctx, `INSERT INTO workflow_nodes (run_id, node, status) SELECT $1, unnest($2::text[]), 'pending'`, runID, nodes)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store workflow run: %w", err)
	}
	if !inserted {
		var existing string
		if err := s.db.QueryRow(ctx, `SELECT id::text FROM workflow_runs WHERE workflow_id = $1 AND idempotency_key = $2`,
			w.ID, idempotencyKey).Scan(&existing); err != nil {
			return nil, fmt.Errorf("read replayed run: %w", err)
		}
		r, err := s.GetRun(ctx, v, existing)
		if err != nil {
			return nil, err
		}
		if !reflect.DeepEqual(normalize(r.ExtraVars), normalize(l.ExtraVars)) {
			return nil, deployments.ErrIdempotencyMismatch
		}
		r.Replayed = true
		return r, nil
	}
	s.changed()
	return s.GetRun(ctx, v, runID.String())
}

// normalize is v as JSON gives it back (numbers as float64).
func normalize(v map[string]any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	if m, ok := out.(map[string]any); ok && len(m) == 0 {
		return nil
	}
	return out
}

const runColumns = `id::text, workflow_id::text, project_id, version, graph, extra_vars, COALESCE(api_key_id::text, ''), status, error, created_at, finished_at`

// runRow is a run as stored, with the key it launches as.
type runRow struct {
	Run
	keyID string
}

func scanRun(row pgx.Row) (*runRow, error) {
	var r runRow
	var graph, vars []byte
	if err := row.Scan(&r.ID, &r.WorkflowID, &r.ProjectID, &r.Version, &graph, &vars, &r.keyID, &r.Status, &r.Error,
		&r.CreatedAt, &r.FinishedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(graph, &r.Graph); err != nil {
		return nil, fmt.Errorf("run %s: graph: %w", r.ID, err)
	}
	if err := json.Unmarshal(vars, &r.ExtraVars); err != nil {
		return nil, fmt.Errorf("run %s: extra vars: %w", r.ID, err)
	}
	if len(r.ExtraVars) == 0 {
		r.ExtraVars = nil
	}
	return &r, nil
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readNodes returns the nodes of run id in the graph's order.
func readNodes(ctx context.Context, q querier, r *Run) error {
	rows, err := q.Query(ctx, `SELECT node, status, outcome, COALESCE(job_id::text, ''), artifacts, deadline,
		COALESCE(decided_by::text, ''), reason, error, started_at, finished_at FROM workflow_nodes WHERE run_id = $1`, r.ID)
	if err != nil {
		return fmt.Errorf("read run nodes: %w", err)
	}
	byID, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeRun, error) {
		var n NodeRun
		var artifacts []byte
		err := row.Scan(&n.ID, &n.Status, &n.Outcome, &n.JobID, &artifacts, &n.Deadline, &n.DecidedBy, &n.Reason, &n.Error,
			&n.StartedAt, &n.FinishedAt)
		if err == nil && len(artifacts) > 0 {
			err = json.Unmarshal(artifacts, &n.Artifacts)
		}
		return n, err
	})
	if err != nil {
		return fmt.Errorf("read run nodes: %w", err)
	}
	r.Nodes = r.Nodes[:0]
	for _, gn := range r.Graph.Nodes {
		for _, n := range byID {
			if n.ID == gn.ID {
				r.Nodes = append(r.Nodes, n)
			}
		}
	}
	return nil
}

// GetRun returns the run id with its nodes, when v sees its project.
func (s *Service) GetRun(ctx context.Context, v deployments.Visibility, id string) (*Run, error) {
	r, err := s.getRun(ctx, v, id)
	if err != nil {
		return nil, err
	}
	return &r.Run, nil
}

func (s *Service) getRun(ctx context.Context, v deployments.Visibility, id string) (*runRow, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	r, err := scanRun(s.db.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read workflow run: %w", err)
	}
	if !v.Holds(r.ProjectID) {
		return nil, ErrNotFound
	}
	return r, readNodes(ctx, s.db, &r.Run)
}

// ListRuns returns the latest runs of workflow id, newest first, without
// their nodes.
func (s *Service) ListRuns(ctx context.Context, v deployments.Visibility, id string, limit int) ([]*Run, error) {
	w, err := s.Get(ctx, v, id)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 100 {
		limit = 50
	}
	rows, err := s.db.Query(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE workflow_id = $1 ORDER BY created_at DESC LIMIT $2`, w.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("list workflow runs: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Run, error) {
		rr, err := scanRun(r)
		if err != nil {
			return nil, err
		}
		rr.Nodes = []NodeRun{}
		return &rr.Run, nil
	})
	return list, err
}

// Decision errors.
var (
	// ErrNotWaiting: the node is no approval waiting for a decision.
	ErrNotWaiting = errors.New("the node is not an approval waiting for a decision")
	// ErrNotApprover: the approval names its approvers, and the key is
	// not one of them.
	ErrNotApprover = errors.New("this API key is not among the approval's approvers")
)

// Decide approves (or denies) the waiting approval node of run runID as
// key, with reason. The engine takes the edges from it.
func (s *Service) Decide(ctx context.Context, key *auth.Key, v deployments.Visibility, runID, node string, approve bool, reason string) (*Run, error) {
	r, err := s.getRun(ctx, v, runID)
	if err != nil {
		return nil, err
	}
	gn := r.Graph.node(node)
	if gn == nil {
		return nil, ErrNotFound
	}
	if gn.Approval == nil {
		return nil, ErrNotWaiting
	}
	if len(gn.Approval.Approvers) > 0 && !slices.Contains(gn.Approval.Approvers, key.ID) {
		return nil, ErrNotApprover
	}
	if len(reason) > 1000 {
		return nil, invalid(field("reason", "at most 1000 characters"))
	}
	status, outcome := NodeSucceeded, OutcomeApproved
	if !approve {
		status, outcome = NodeFailed, OutcomeDenied
	}
	tag, err := s.db.Exec(ctx, `UPDATE workflow_nodes SET status = $3, outcome = $4, decided_by = $5, reason = $6, finished_at = now()
		WHERE run_id = $1 AND node = $2 AND status = 'waiting' AND deadline > now()
		AND EXISTS (SELECT 1 FROM workflow_runs WHERE id = $1 AND status = 'running')`,
		r.ID, node, status, outcome, key.ID, reason)
	if err != nil {
		return nil, fmt.Errorf("decide approval: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil, ErrNotWaiting
	}
	s.changed()
	return s.GetRun(ctx, v, r.ID)
}

// ErrFinished: the run has ended.
var ErrFinished = errors.New("the workflow run has ended")

// Cancel stops run runID: no node starts any more, waiting approvals end
// cancelled, and running jobs are cancelled (the engine does it and
// finishes the run once they have ended).
func (s *Service) Cancel(ctx context.Context, v deployments.Visibility, runID string) (*Run, error) {
	r, err := s.getRun(ctx, v, runID)
	if err != nil {
		return nil, err
	}
	tag, err := s.db.Exec(ctx, `UPDATE workflow_runs SET status = 'cancelling' WHERE id = $1 AND status = 'running'`, r.ID)
	if err != nil {
		return nil, fmt.Errorf("cancel workflow run: %w", err)
	}
	if tag.RowsAffected() == 0 && r.Status != RunCancelling {
		return nil, ErrFinished
	}
	s.changed()
	return s.GetRun(ctx, v, r.ID)
}
