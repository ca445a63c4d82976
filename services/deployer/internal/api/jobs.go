package api

import (
	"net/http"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Job is an Ansible job (or a deployment, on the same paths) as
// /api/v1/jobs shows it: seed 002's job status with the deployer's links.
type Job struct {
	ID     string             `json:"id"`
	JobID  string             `json:"job_id"`
	Kind   string             `json:"kind"`
	Source string             `json:"source"`
	Status deployments.Status `json:"status"`
	// ProjectID is the job's project.
	ProjectID string `json:"project_id,omitempty"`
	// Request is what was asked: a job's request (credentials as the
	// references they resolved to), or a deployment's.
	Request           any         `json:"request"`
	RequestID         string      `json:"request_id,omitempty"`
	CreatedAt         time.Time   `json:"created_at"`
	StartedAt         *time.Time  `json:"started_at,omitempty"`
	FinishedAt        *time.Time  `json:"finished_at,omitempty"`
	CancelRequestedAt *time.Time  `json:"cancel_requested_at,omitempty"`
	Progress          JobProgress `json:"progress"`
	// Waiting says why a queued job has not started, when the API can
	// tell: no infra replica serves its pool, or its hosts are busy.
	Waiting string `json:"waiting,omitempty"`
	// Queue is where a queued job waits for busy hosts: runs start in
	// arrival order per host.
	Queue  *JobQueue           `json:"queue,omitempty"`
	Result *deployments.Result `json:"result,omitempty"`
	// LogURL is the full run log (GET, same key), once the job ended.
	LogURL string   `json:"log_url"`
	Links  JobLinks `json:"links"`
}

// JobProgress is where a job is: its current play and task, and its hosts
// by state (pending: not yet seen in any task, when the host count is
// known: an inline inventory or a deployment's one server).
type JobProgress struct {
	CurrentPlay      string `json:"current_play,omitempty"`
	CurrentTask      string `json:"current_task,omitempty"`
	HostsOK          int    `json:"hosts_ok"`
	HostsChanged     int    `json:"hosts_changed"`
	HostsFailed      int    `json:"hosts_failed"`
	HostsUnreachable int    `json:"hosts_unreachable"`
	HostsPending     *int   `json:"hosts_pending,omitempty"`
	Events           int    `json:"events"`
}

// JobQueue is where a queued job stands in the lines of its busy hosts.
type JobQueue struct {
	// Position is 1 for a job next in line on every host it waits for;
	// otherwise 1 + the most runs ahead of it on any one of them.
	Position int `json:"position"`
	// Hosts are the lines it is in, by lock target (a server's
	// "server:<handle>", else "<address>:<port>").
	Hosts []store.LinePlace `json:"hosts"`
}

// JobLinks are a job's related resources.
type JobLinks struct {
	Self     string `json:"self"`
	Stream   string `json:"stream"`
	Logs     string `json:"logs"`
	Webhooks string `json:"webhooks"`
}

// JobList is a page of jobs.
type JobList struct {
	Items      []*Job `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
	Links      struct {
		Next string `json:"next,omitempty"`
	} `json:"links"`
}

// jobView shows a deployment row (a job or a deployment) as a Job.
func jobView(d *deployments.Deployment) any { return toJob(d) }

func toJob(d *deployments.Deployment) *Job {
	base := "/api/v1/jobs/" + d.ID
	j := &Job{ID: d.ID, JobID: d.JobID, Kind: d.Kind, Source: d.Source, Status: d.Status, ProjectID: d.Request.ProjectID,
		RequestID: d.RequestID, CreatedAt: d.CreatedAt, StartedAt: d.StartedAt, FinishedAt: d.FinishedAt,
		CancelRequestedAt: d.CancelRequestedAt, Result: d.Result, LogURL: base + "/logs",
		Links: JobLinks{Self: base, Stream: base + "/stream", Logs: base + "/logs", Webhooks: "/api/v1/deployments/" + d.ID + "/webhooks"}}
	hosts := -1
	switch {
	case d.Job != nil:
		j.Request = d.Job
		if d.Job.Inventory.Type == string(messages.InventoryInline) {
			hosts = len(d.Job.Inventory.Hosts)
		}
	default:
		j.Request = d.Request
		if d.Kind != deployments.KindJob {
			hosts = 1
		}
	}
	if p := d.Progress; p != nil {
		j.Progress = JobProgress{CurrentPlay: p.CurrentPlay, CurrentTask: p.CurrentTask, HostsOK: p.HostsOK,
			HostsChanged: p.HostsChanged, HostsFailed: p.HostsFailed, HostsUnreachable: p.HostsUnreachable, Events: p.Events}
	}
	if d.Result != nil && len(d.Result.Hosts) > 0 {
		// The recap is the final word on every host.
		pr := &j.Progress
		pr.HostsOK, pr.HostsChanged, pr.HostsFailed, pr.HostsUnreachable = 0, 0, 0, 0
		for _, h := range d.Result.Hosts {
			switch {
			case h.Unreachable > 0:
				pr.HostsUnreachable++
			case h.Failed > 0:
				pr.HostsFailed++
			case h.Changed > 0:
				pr.HostsChanged++
			default:
				pr.HostsOK++
			}
		}
	}
	if hosts >= 0 {
		pending := 0
		if !d.Status.Terminal() {
			pr := j.Progress
			pending = max(hosts-pr.HostsOK-pr.HostsChanged-pr.HostsFailed-pr.HostsUnreachable, 0)
		}
		j.Progress.HostsPending = &pending
	}
	return j
}

func (a *API) createJob(w http.ResponseWriter, r *http.Request) {
	key := authedKey(r.Context())
	idem, wait, ok := a.submitHeaders(w, r)
	if !ok {
		return
	}
	var req deployments.JobRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	if req.Template != nil || req.RelaunchOf != "" {
		field := "template"
		if req.Template == nil {
			field = "relaunch_of"
		}
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the request is invalid: see errors",
			FieldProblem{Field: field, Message: "set by a template's launch or a relaunch, not by a submit"})
		return
	}
	req.ProjectID = keyProject(key, req.ProjectID)
	ctx := tracing.Extract(r.Context(), messages.TraceContext{
		Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate")})
	sub, err := a.deps.Deployments.SubmitJob(ctx, key.ID, visibility(key), req, idem)
	a.answerSubmit(w, r, sub, err, wait, jobView)
}

func (a *API) getJob(w http.ResponseWriter, r *http.Request) {
	a.get(w, r, func(d *deployments.Deployment) any {
		j := toJob(d)
		j.Waiting, j.Queue = a.waiting(r.Context(), d)
		return j
	})
}

func (a *API) cancelJob(w http.ResponseWriter, r *http.Request) { a.cancel(w, r, jobView) }

func (a *API) listJobs(w http.ResponseWriter, r *http.Request) {
	a.list(w, r, deployments.KindJob, "/api/v1/jobs", func(items []*deployments.Deployment, next, nextLink string) any {
		out := JobList{Items: make([]*Job, len(items)), NextCursor: next}
		for i, d := range items {
			out.Items[i] = toJob(d)
		}
		out.Links.Next = nextLink
		return out
	})
}

// jobScopes are the scopes of /jobs/{id}: a job's, or a deployment's for a
// deployment's id (its scope is checked once the row is found).
func jobScopes(write bool) []auth.Scope {
	if write {
		return []auth.Scope{auth.ScopeJobsWrite, auth.ScopeDeploymentsWrite}
	}
	return []auth.Scope{auth.ScopeJobsRead, auth.ScopeDeploymentsRead}
}
