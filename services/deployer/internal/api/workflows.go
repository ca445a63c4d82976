package api

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// WorkflowList is the answer of GET /workflows.
type WorkflowList struct {
	Items []*workflows.Workflow `json:"items"`
}

// WorkflowRunList is the answer of GET /workflows/{id}/runs.
type WorkflowRunList struct {
	Items []*workflows.Run `json:"items"`
}

// Decision is the body of an approval's approve or deny.
type Decision struct {
	Reason string `json:"reason,omitempty"`
}

// servesWorkflows answers 503 when this deployer has no workflows.
func (a *API) servesWorkflows(w http.ResponseWriter, r *http.Request) bool {
	if a.deps.Workflows == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "workflows are not served by this deployer")
		return false
	}
	return true
}

// workflowError answers err of the workflows and reports whether it did.
func (a *API) workflowError(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, workflows.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no workflow (or run, or node) has this id")
	case errors.Is(err, workflows.ErrExists):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a workflow of this name exists in the project",
			FieldProblem{Field: "name", Message: "taken in this project"})
	case errors.Is(err, workflows.ErrNotWaiting), errors.Is(err, workflows.ErrFinished):
		writeProblem(w, r, http.StatusConflict, ProbConflict, err.Error())
	case errors.Is(err, workflows.ErrNotApprover):
		writeProblem(w, r, http.StatusForbidden, ProbForbidden, err.Error())
	case errors.Is(err, deployments.ErrIdempotencyMismatch):
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbIdempotency,
			"this Idempotency-Key was first used with another request body; use a new key for a new request")
	default:
		return a.credentialError(w, r, err)
	}
	return true
}

func (a *API) createWorkflow(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	var req workflows.Save
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	req.ProjectID = keyProject(key, req.ProjectID)
	wf, err := a.deps.Workflows.Create(r.Context(), visibility(key), req)
	if a.workflowError(w, r, err) {
		return
	}
	w.Header().Set("Location", "/api/v1/workflows/"+wf.ID)
	writeJSON(w, http.StatusCreated, wf)
}

func (a *API) listWorkflows(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	list, err := a.deps.Workflows.List(r.Context(), visibility(authedKey(r.Context())))
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, WorkflowList{Items: orEmpty(list)})
}

func (a *API) getWorkflow(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	wf, err := a.deps.Workflows.Get(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"))
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, wf)
}

func (a *API) updateWorkflow(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	var req workflows.Save
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	wf, err := a.deps.Workflows.Update(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"), req)
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, wf)
}

func (a *API) deleteWorkflow(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	if a.workflowError(w, r, a.deps.Workflows.Delete(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) launchWorkflow(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	idem, _, ok := a.submitHeaders(w, r)
	if !ok {
		return
	}
	var l workflows.LaunchRun
	if r.ContentLength != 0 && !decodeJSON(w, r, a.cfg.MaxBody, &l) {
		return
	}
	key := authedKey(r.Context())
	run, err := a.deps.Workflows.Launch(r.Context(), key.ID, visibility(key), chi.URLParam(r, "id"), l, idem)
	if a.workflowError(w, r, err) {
		return
	}
	status := http.StatusCreated
	if run.Replayed {
		status = http.StatusOK
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/api/v1/workflow-runs/"+run.ID)
	writeJSON(w, status, run)
}

func (a *API) listWorkflowRuns(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	list, err := a.deps.Workflows.ListRuns(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"), 50)
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, WorkflowRunList{Items: orEmpty(list)})
}

func (a *API) getWorkflowRun(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	run, err := a.deps.Workflows.GetRun(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"))
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (a *API) cancelWorkflowRun(w http.ResponseWriter, r *http.Request) {
	if !a.servesWorkflows(w, r) {
		return
	}
	run, err := a.deps.Workflows.Cancel(r.Context(), visibility(authedKey(r.Context())), chi.URLParam(r, "id"))
	if a.workflowError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusAccepted, run)
}

// decideApproval approves (approve true) or denies a waiting approval
// node of a run.
func (a *API) decideApproval(approve bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.servesWorkflows(w, r) {
			return
		}
		var d Decision
		if r.ContentLength != 0 && !decodeJSON(w, r, a.cfg.MaxBody, &d) {
			return
		}
		key := authedKey(r.Context())
		run, err := a.deps.Workflows.Decide(r.Context(), key, visibility(key), chi.URLParam(r, "id"), chi.URLParam(r, "node"), approve, d.Reason)
		if a.workflowError(w, r, err) {
			return
		}
		writeJSON(w, http.StatusOK, run)
	}
}

// workflowRoutes mounts /workflows and /workflow-runs.
func (a *API) workflowRoutes(r chi.Router) {
	tread, twrite, launch := auth.ScopeTemplatesRead, auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch
	r.Route("/workflows", func(r chi.Router) {
		r.With(a.authenticate(twrite)).Post("/", a.createWorkflow)
		r.With(a.authenticate(tread)).Get("/", a.listWorkflows)
		r.Route("/{id}", func(r chi.Router) {
			r.With(a.authenticate(tread)).Get("/", a.getWorkflow)
			r.With(a.authenticate(twrite)).Put("/", a.updateWorkflow)
			r.With(a.authenticate(twrite)).Delete("/", a.deleteWorkflow)
			r.With(a.authenticate(launch)).Post("/launch", a.launchWorkflow)
			r.With(a.authenticate(tread)).Get("/runs", a.listWorkflowRuns)
		})
	})
	r.Route("/workflow-runs/{id}", func(r chi.Router) {
		r.With(a.authenticate(tread)).Get("/", a.getWorkflowRun)
		r.With(a.authenticate(launch)).Post("/cancel", a.cancelWorkflowRun)
		r.With(a.authenticate(launch)).Post("/nodes/{node}/approve", a.decideApproval(true))
		r.With(a.authenticate(launch)).Post("/nodes/{node}/deny", a.decideApproval(false))
	})
}
