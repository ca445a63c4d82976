package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// Jobs reads and cancels the jobs of the nodes (deployments.Service).
type Jobs interface {
	Get(ctx context.Context, id string) (*deployments.Deployment, error)
	Cancel(ctx context.Context, v deployments.Visibility, id string) (*deployments.Deployment, deployments.CancelOutcome, error)
}

// EngineConfig configures an Engine.
type EngineConfig struct {
	// Poll is how often active runs are advanced without a wake. Default 1s.
	Poll   time.Duration
	Logger zerolog.Logger
	// Registerer takes the engine's metrics; nil: none.
	Registerer prometheus.Registerer
}

// Engine advances workflow runs: it takes each active run (FOR UPDATE SKIP
// LOCKED, so replicas share them), records the nodes whose job ended or
// whose approval timed out, starts the nodes the edges now lead to, and
// ends the run when every node has. A job node launches its template as
// the run's API key with the Idempotency-Key "workflow:<run>:<node>": a
// round cut short (kill -9 after the launch) replays the same job next
// round instead of launching a second.
type Engine struct {
	svc   *Service
	jobs  Jobs
	sub   templates.Submitter
	keys  templates.Keys
	cfg   EngineConfig
	log   zerolog.Logger
	nodes *prometheus.CounterVec
	wake  chan struct{}
}

// NewEngine returns an Engine of svc's runs.
func NewEngine(svc *Service, jobs Jobs, sub templates.Submitter, keys templates.Keys, cfg EngineConfig) (*Engine, error) {
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	e := &Engine{svc: svc, jobs: jobs, sub: sub, keys: keys, cfg: cfg,
		log: cfg.Logger.With().Str("component", "workflow-engine").Logger(),
		nodes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "autoprov_deployer_workflow_nodes_total",
			Help: "Workflow nodes ended, by status (succeeded, failed, skipped, cancelled)."}, []string{"status"}),
		wake: make(chan struct{}, 1)}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(e.nodes); err != nil {
			return nil, err
		}
	}
	svc.OnChange(e.Wake)
	return e, nil
}

// Wake makes Run advance the runs now.
func (e *Engine) Wake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run advances runs every Poll (or when woken) until ctx is done.
func (e *Engine) Run(ctx context.Context) error {
	t := time.NewTicker(e.cfg.Poll)
	defer t.Stop()
	for {
		if _, err := e.Advance(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg("advance workflow runs; retried")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-e.wake:
		}
	}
}

// Advance advances every active run once; it returns how many it took.
func (e *Engine) Advance(ctx context.Context) (int, error) {
	rows, err := e.svc.db.Query(ctx, `SELECT id::text FROM workflow_runs WHERE status IN ('running', 'cancelling') ORDER BY created_at LIMIT 500`)
	if err != nil {
		return 0, fmt.Errorf("active workflow runs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("active workflow runs: %w", err)
	}
	var (
		mu    sync.Mutex
		errs  []error
		taken int
		wg    sync.WaitGroup
		slots = make(chan struct{}, 4)
	)
	for _, id := range ids {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ok, err := e.advance(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				taken++
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("run %s: %w", id, err))
			}
		})
	}
	wg.Wait()
	return taken, errors.Join(errs...)
}

// step is one round over a run: its nodes by id, and those it changed.
type step struct {
	e       *Engine
	r       *runRow
	byID    map[string]*NodeRun
	changed map[string]bool
	now     time.Time
}

func (st *step) set(n *NodeRun, status, outcome string) {
	n.Status, n.Outcome = status, outcome
	if n.done() {
		now := st.now
		n.FinishedAt = &now
		st.e.nodes.WithLabelValues(status).Inc()
	}
	st.changed[n.ID] = true
}

// advance takes run id unless another engine holds it, and moves it on.
func (e *Engine) advance(ctx context.Context, id string) (bool, error) {
	tx, err := e.svc.db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	r, err := scanRun(tx.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs
		WHERE id = $1 AND status IN ('running', 'cancelling') FOR UPDATE SKIP LOCKED`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // another engine has it, or it ended
	}
	if err != nil {
		return false, err
	}
	if err := readNodes(ctx, tx, &r.Run); err != nil {
		return false, err
	}
	st := &step{e: e, r: r, byID: map[string]*NodeRun{}, changed: map[string]bool{}, now: time.Now()}
	for i := range r.Nodes {
		st.byID[r.Nodes[i].ID] = &r.Nodes[i]
	}
	if err := st.collect(ctx); err != nil {
		return false, err
	}
	if r.Status == RunRunning {
		if err := st.start(ctx); err != nil {
			return false, err
		}
	} else {
		st.cancelPending()
	}
	final, msg := st.final()
	for id := range st.changed {
		n := st.byID[id]
		var artifacts []byte
		if n.Artifacts != nil {
			if artifacts, err = json.Marshal(n.Artifacts); err != nil {
				return false, err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE workflow_nodes SET status = $3, outcome = $4, job_id = NULLIF($5, '')::uuid,
			artifacts = $6, deadline = $7, error = $8, started_at = $9, finished_at = $10 WHERE run_id = $1 AND node = $2`,
			r.ID, id, n.Status, n.Outcome, n.JobID, artifacts, n.Deadline, truncate(n.Error, 2000), n.StartedAt, n.FinishedAt); err != nil {
			return false, fmt.Errorf("record node %s: %w", id, err)
		}
	}
	if final != "" {
		if _, err := tx.Exec(ctx, `UPDATE workflow_runs SET status = $2, error = $3, finished_at = now() WHERE id = $1`,
			r.ID, final, truncate(msg, 2000)); err != nil {
			return false, fmt.Errorf("finish run: %w", err)
		}
		e.log.Info().Str("workflow_run_id", r.ID).Str("workflow_id", r.WorkflowID).Str("status", final).Msg("workflow run ended")
	}
	return true, tx.Commit(ctx)
}

// collect records the running jobs that ended and the approvals that
// timed out; while the run is cancelling it cancels running jobs and ends
// waiting approvals.
func (st *step) collect(ctx context.Context) error {
	cancelling := st.r.Status == RunCancelling
	for _, n := range st.r.Nodes {
		n := st.byID[n.ID]
		switch n.Status {
		case NodeRunning:
			d, err := st.e.jobs.Get(ctx, n.JobID)
			if err != nil {
				return fmt.Errorf("read the job of node %s: %w", n.ID, err)
			}
			if !d.Status.Terminal() {
				if cancelling && n.Outcome != "cancel_requested" {
					if _, _, err := st.e.jobs.Cancel(ctx, deployments.Visibility{Projects: []string{st.r.ProjectID}}, n.JobID); err != nil {
						return fmt.Errorf("cancel the job of node %s: %w", n.ID, err)
					}
					n.Outcome = "cancel_requested"
					st.changed[n.ID] = true
				}
				continue
			}
			if d.Result != nil && d.Result.Artifacts != nil {
				n.Artifacts = d.Result.Artifacts
			}
			switch {
			case d.Status == deployments.StatusSucceeded:
				st.set(n, NodeSucceeded, string(d.Status))
			case d.Status == deployments.StatusCancelled && cancelling:
				st.set(n, NodeCancelled, string(d.Status))
			default:
				st.set(n, NodeFailed, string(d.Status))
			}
		case NodeWaiting:
			switch {
			case cancelling:
				st.set(n, NodeCancelled, "")
			case n.Deadline != nil && !st.now.Before(*n.Deadline):
				st.set(n, NodeFailed, OutcomeTimedOut)
			}
		}
	}
	return nil
}

// cancelPending ends the nodes that never started, for a cancelled run.
func (st *step) cancelPending() {
	for _, n := range st.r.Nodes {
		if n := st.byID[n.ID]; n.Status == NodePending {
			st.set(n, NodeCancelled, "")
		}
	}
}

// taken reports whether edge e is taken, given its From node's state.
func taken(from *NodeRun, on string) bool {
	switch from.Status {
	case NodeSucceeded:
		return on == OnSuccess || on == OnAlways
	case NodeFailed:
		return on == OnFailure || on == OnAlways
	}
	return false // skipped or cancelled: no edge from it is taken
}

// start starts, or skips, each pending node whose parents have all ended,
// until none is left to decide.
func (st *step) start(ctx context.Context) error {
	for progress := true; progress; {
		progress = false
		for _, gn := range st.r.Graph.Nodes {
			n := st.byID[gn.ID]
			if n == nil || n.Status != NodePending {
				continue
			}
			parents, fire := 0, false
			ready := true
			for _, e := range st.r.Graph.Edges {
				if e.To != gn.ID {
					continue
				}
				parents++
				from := st.byID[e.From]
				if !from.done() {
					ready = false
					break
				}
				fire = fire || taken(from, e.On)
			}
			if !ready {
				continue
			}
			progress = true
			if parents > 0 && !fire {
				st.set(n, NodeSkipped, "")
				continue
			}
			if err := st.startNode(ctx, &gn, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// startNode starts gn: an approval waits, a job node launches.
func (st *step) startNode(ctx context.Context, gn *Node, n *NodeRun) error {
	now := st.now
	n.StartedAt = &now
	st.changed[n.ID] = true
	if gn.Approval != nil {
		deadline := now.Add(gn.Approval.Timeout())
		n.Deadline = &deadline
		n.Status = NodeWaiting
		st.e.log.Info().Str("workflow_run_id", st.r.ID).Str("node", n.ID).Time("deadline", deadline).Msg("approval needed")
		return nil
	}
	key, refusal, err := templates.LaunchKey(ctx, st.e.keys, st.r.keyID, st.r.ProjectID, "workflow run")
	if err != nil {
		return err
	}
	if refusal == "" {
		var l templates.Launch
		if gn.Launch != nil {
			l = *gn.Launch
		}
		l.Passed = st.passed(gn.ID)
		var sub *deployments.Submission
		sub, err = st.e.svc.templates.Launch(ctx, st.e.sub, key.ID, deployments.Visibility{Projects: []string{st.r.ProjectID}},
			gn.TemplateID, l, "workflow:"+st.r.ID+":"+gn.ID)
		refusal, err = templates.LaunchRefusal(err)
		if err != nil {
			return err
		}
		if refusal == "" {
			n.JobID, n.Status = sub.Deployment.ID, NodeRunning
			return nil
		}
	}
	n.Error = refusal
	st.set(n, NodeFailed, "not_launched")
	return nil
}

// passed are the extra vars node id's job gets: the run's, then the
// artifacts of the nodes before it (its ancestors), the earliest ended
// first, so a later step's value of a name wins.
func (st *step) passed(id string) map[string]any {
	ancestors := map[string]bool{}
	queue := []string{id}
	for len(queue) > 0 {
		to := queue[0]
		queue = queue[1:]
		for _, e := range st.r.Graph.Edges {
			if e.To == to && !ancestors[e.From] {
				ancestors[e.From] = true
				queue = append(queue, e.From)
			}
		}
	}
	var withArtifacts []*NodeRun
	for a := range ancestors {
		if n := st.byID[a]; n.Artifacts != nil && n.FinishedAt != nil {
			withArtifacts = append(withArtifacts, n)
		}
	}
	slices.SortFunc(withArtifacts, func(a, b *NodeRun) int {
		if c := a.FinishedAt.Compare(*b.FinishedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := maps.Clone(st.r.ExtraVars)
	if out == nil {
		out = map[string]any{}
	}
	for _, n := range withArtifacts {
		maps.Copy(out, n.Artifacts)
	}
	return out
}

// final is the run's status once every node has ended ("" before), and
// why it failed: a node failed and no edge from it handles its failure.
func (st *step) final() (string, string) {
	for _, n := range st.r.Nodes {
		if !st.byID[n.ID].done() {
			return "", ""
		}
	}
	if st.r.Status == RunCancelling {
		return RunCancelled, "cancelled"
	}
	var unhandled []string
	for _, n := range st.r.Nodes {
		n := st.byID[n.ID]
		if n.Status != NodeFailed {
			continue
		}
		handled := false
		for _, e := range st.r.Graph.Edges {
			if e.From == n.ID && (e.On == OnFailure || e.On == OnAlways) {
				handled = true
			}
		}
		if !handled {
			unhandled = append(unhandled, fmt.Sprintf("%s (%s)", n.ID, n.Outcome))
		}
	}
	if len(unhandled) > 0 {
		return RunFailed, "failed without a failure path: " + strings.Join(unhandled, ", ")
	}
	return RunSucceeded, ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
