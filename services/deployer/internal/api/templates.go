package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// TemplateRequest is the body of POST /templates and PUT /templates/{id}:
// a template's definition (a PUT saves it as the next version).
type TemplateRequest struct {
	ProjectID string `json:"project_id"`
	Name      string `json:"name"`
	templates.Definition
	// Version, on a PUT, refuses the change (409) unless the template's
	// current version is this one.
	Version int `json:"version,omitempty"`
}

// TemplateList is the answer of GET /templates and of a template's
// versions.
type TemplateList struct {
	Items []*templates.Template `json:"items"`
}

// RelaunchRequest is the body of POST /jobs/{id}/relaunch.
type RelaunchRequest struct {
	// Hosts is "all" (the default) or "failed": only the hosts that
	// failed or were unreachable.
	Hosts string `json:"hosts,omitempty"`
}

// servesTemplates answers 503 when this deployer has no templates.
func (a *API) servesTemplates(w http.ResponseWriter, r *http.Request) bool {
	if a.deps.Templates == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "templates are not served by this deployer")
		return false
	}
	return true
}

func (a *API) createTemplate(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	var req TemplateRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	t, err := a.deps.Templates.Create(r.Context(), key.ID, visibility(key), templates.Save{
		ProjectID: keyProject(key, req.ProjectID), Name: req.Name, Definition: req.Definition})
	if a.templateError(w, r, err) {
		return
	}
	w.Header().Set("Location", "/api/v1/templates/"+t.ID)
	writeJSON(w, http.StatusCreated, t)
}

func (a *API) updateTemplate(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	var req TemplateRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	t, err := a.deps.Templates.Update(r.Context(), key.ID, visibility(key), chi.URLParam(r, "id"), templates.Save{
		ProjectID: req.ProjectID, Name: req.Name, Definition: req.Definition, IfVersion: req.Version})
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (a *API) getTemplate(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	version := 0
	for name, vals := range r.URL.Query() {
		n, err := strconv.Atoi(vals[0])
		if name != "version" || err != nil || n < 1 {
			writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, "only ?version=<n> (n ≥ 1) is known",
				FieldProblem{Field: "query", Message: "only version, a positive integer, is known"})
			return
		}
		version = n
	}
	key := authedKey(r.Context())
	t, err := a.deps.Templates.Get(r.Context(), visibility(key), chi.URLParam(r, "id"), version)
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (a *API) listTemplates(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	if !onlyProjectQuery(w, r) {
		return
	}
	key := authedKey(r.Context())
	list, err := a.deps.Templates.List(r.Context(), visibility(key), r.URL.Query().Get("project_id"))
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, TemplateList{Items: orEmpty(list)})
}

func (a *API) templateVersions(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	list, err := a.deps.Templates.Versions(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, TemplateList{Items: orEmpty(list)})
}

func (a *API) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	if a.templateError(w, r, a.deps.Templates.Delete(r.Context(), visibility(key), chi.URLParam(r, "id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// launchTemplate submits a job from the template: a job's submit
// (Idempotency-Key, ?wait=, traceparent) answered as POST /jobs answers.
func (a *API) launchTemplate(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	idem, wait, ok := a.submitHeaders(w, r)
	if !ok {
		return
	}
	var l templates.Launch
	if r.ContentLength != 0 && !decodeJSON(w, r, a.cfg.MaxBody, &l) {
		return
	}
	key := authedKey(r.Context())
	ctx := tracing.Extract(r.Context(), messages.TraceContext{
		Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate")})
	sub, err := a.deps.Templates.Launch(ctx, a.deps.Deployments, key.ID, visibility(key), chi.URLParam(r, "id"), l, idem)
	if errors.Is(err, templates.ErrNotFound) {
		a.templateError(w, r, err)
		return
	}
	a.answerSubmit(w, r, sub, err, wait, jobView)
}

// relaunch submits a finished job or deployment again (POST
// /jobs/{id}/relaunch, /deployments/{id}/relaunch): with the same inputs,
// or on its failed hosts only; the new run is shown with show.
func (a *API) relaunch(show view) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { a.relaunchWith(w, r, show) }
}

func (a *API) relaunchWith(w http.ResponseWriter, r *http.Request, show view) {
	idem, wait, ok := a.submitHeaders(w, r)
	if !ok {
		return
	}
	var req RelaunchRequest
	if r.ContentLength != 0 && !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	if req.Hosts != "" && req.Hosts != "all" && req.Hosts != "failed" {
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the request is invalid: see errors",
			FieldProblem{Field: "hosts", Message: "must be all or failed"})
		return
	}
	d, ok := a.find(w, r, true)
	if !ok {
		return
	}
	key := authedKey(r.Context())
	sub, err := a.deps.Deployments.Relaunch(r.Context(), key.ID, visibility(key), d, req.Hosts == "failed", idem)
	switch {
	case errors.Is(err, deployments.ErrNotFinished):
		writeProblemValue(w, r, Problem{Type: ProbConflict, Status: http.StatusConflict,
			Detail: "the run has not finished: relaunch it once it has", DeploymentStatus: string(d.Status)})
		return
	case errors.Is(err, deployments.ErrNoFailedHosts):
		writeProblemValue(w, r, Problem{Type: ProbConflict, Status: http.StatusConflict,
			Detail: "no host of the run failed or was unreachable: nothing to relaunch on its failed hosts", DeploymentStatus: string(d.Status)})
		return
	case errors.Is(err, deployments.ErrNotRelaunchable):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "the run was published by another producer: the deployer does not hold its request")
		return
	}
	a.answerSubmit(w, r, sub, err, wait, show)
}

// templateError answers err of the templates and reports whether it did.
func (a *API) templateError(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, templates.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no template (or schedule) has this id, or no such version")
	case errors.Is(err, templates.ErrExists):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a template of this name exists in the project",
			FieldProblem{Field: "name", Message: "taken in this project"})
	case errors.Is(err, templates.ErrVersionConflict):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "the template has a newer version than the one given: read it and save again",
			FieldProblem{Field: "version", Message: "not the template's current version"})
	default:
		return a.credentialError(w, r, err)
	}
	return true
}

func orEmpty[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}

// ScheduleList is the answer of GET /templates/{id}/schedules.
type ScheduleList struct {
	Items []*templates.Schedule `json:"items"`
}

func (a *API) createSchedule(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	if !key.Has(auth.ScopeTemplatesLaunch) {
		// A schedule launches as the key that made it.
		writeProblem(w, r, http.StatusForbidden, ProbForbidden, "a schedule launches as the key that makes it: the key needs templates:launch too")
		return
	}
	var req templates.NewSchedule
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	sc, err := a.deps.Templates.CreateSchedule(r.Context(), key.ID, visibility(key), chi.URLParam(r, "id"), req)
	if errors.Is(err, templates.ErrScheduleExists) {
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a schedule of this name exists in the project",
			FieldProblem{Field: "name", Message: "taken in this project"})
		return
	}
	if a.templateError(w, r, err) {
		return
	}
	w.Header().Set("Location", "/api/v1/schedules/"+sc.ID)
	writeJSON(w, http.StatusCreated, sc)
}

func (a *API) listSchedules(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	list, err := a.deps.Templates.ListSchedules(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, ScheduleList{Items: orEmpty(list)})
}

func (a *API) getSchedule(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	sc, err := a.deps.Templates.GetSchedule(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.templateError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, sc)
}

func (a *API) deleteSchedule(w http.ResponseWriter, r *http.Request) {
	if !a.servesTemplates(w, r) {
		return
	}
	key := authedKey(r.Context())
	if a.templateError(w, r, a.deps.Templates.DeleteSchedule(r.Context(), visibility(key), chi.URLParam(r, "id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseSchedule pauses (paused) or resumes a schedule.
func (a *API) pauseSchedule(paused bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.servesTemplates(w, r) {
			return
		}
		key := authedKey(r.Context())
		sc, err := a.deps.Templates.SetPaused(r.Context(), visibility(key), chi.URLParam(r, "id"), paused)
		if a.templateError(w, r, err) {
			return
		}
		writeJSON(w, http.StatusOK, sc)
	}
}
