package api

import (
	"errors"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// hookMaxBody bounds a webhook from git hosting (a push of many commits
// is larger than an API request).
const hookMaxBody = 5 << 20

// TriggerList is the answer of GET /templates/{id}/triggers.
type TriggerList struct {
	Items []*templates.Trigger `json:"items"`
}

// servesTriggers answers 503 when this deployer has no triggers.
func (a *API) servesTriggers(w http.ResponseWriter, r *http.Request) bool {
	if a.deps.Triggers == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "triggers are not served by this deployer")
		return false
	}
	return true
}

// triggerError answers err of the triggers and reports whether it did.
func (a *API) triggerError(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case errors.Is(err, templates.ErrTriggerExists):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a trigger of this name exists in the project",
			FieldProblem{Field: "name", Message: "taken in this project"})
	case errors.Is(err, templates.ErrNoTriggers):
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, err.Error())
	case errors.Is(err, templates.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no trigger (or template) has this id")
	default:
		return a.templateError(w, r, err)
	}
	return true
}

func (a *API) createTrigger(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	key := authedKey(r.Context())
	if !key.Has(auth.ScopeTemplatesLaunch) {
		// A trigger launches as the key that made it.
		writeProblem(w, r, http.StatusForbidden, ProbForbidden, "a trigger launches as the key that makes it: the key needs templates:launch too")
		return
	}
	var req templates.NewTrigger
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	tr, err := a.deps.Triggers.CreateTrigger(r.Context(), key.ID, visibility(key), chi.URLParam(r, "id"), req)
	if a.triggerError(w, r, err) {
		return
	}
	w.Header().Set("Location", "/api/v1/triggers/"+tr.ID)
	w.Header().Set("Cache-Control", "no-store") // it holds the secret
	writeJSON(w, http.StatusCreated, tr)
}

func (a *API) listTriggers(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	key := authedKey(r.Context())
	list, err := a.deps.Triggers.ListTriggers(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.triggerError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, TriggerList{Items: orEmpty(list)})
}

func (a *API) getTrigger(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	key := authedKey(r.Context())
	tr, err := a.deps.Triggers.GetTrigger(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.triggerError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, tr)
}

func (a *API) deleteTrigger(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	key := authedKey(r.Context())
	if a.triggerError(w, r, a.deps.Triggers.DeleteTrigger(r.Context(), visibility(key), chi.URLParam(r, "id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) rotateTrigger(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	key := authedKey(r.Context())
	tr, err := a.deps.Triggers.RotateSecret(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.triggerError(w, r, err) {
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, tr)
}

// hook takes a webhook of git hosting (POST /hooks/{id}): no API key, the
// trigger's secret proves the sender. 202 with the job launched; 200 when
// the push matches no filter (or is a ping); 401 for a bad signature; 409
// for a replay; 422 when the delivery cannot launch.
func (a *API) hook(w http.ResponseWriter, r *http.Request) {
	if !a.servesTriggers(w, r) {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, hookMaxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, ProbTooLarge, "a webhook body is at most 5 MiB")
		return
	}
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidJSON, "the body could not be read")
		return
	}
	d, err := a.deps.Triggers.Deliver(r.Context(), chi.URLParam(r, "id"), r.Header, body)
	var refused *templates.RefusedError
	var bad *templates.BadPushError
	switch {
	case errors.Is(err, templates.ErrBadSignature):
		writeProblem(w, r, http.StatusUnauthorized, ProbUnauthorized, err.Error())
	case errors.Is(err, templates.ErrReplay):
		writeProblem(w, r, http.StatusConflict, ProbConflict, err.Error())
	case errors.As(err, &refused):
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the delivery cannot launch: "+refused.Reason)
	case errors.As(err, &bad):
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, bad.Error())
	case errors.Is(err, templates.ErrNotFound), errors.Is(err, templates.ErrNoTriggers):
		a.triggerError(w, r, err)
	case err != nil:
		a.log.Error().Err(err).Str("request_id", requestID(r.Context())).Str("trigger_id", chi.URLParam(r, "id")).Msg("trigger delivery")
		retryLater(w, r, "the delivery could not be handled now; nothing was launched: deliver it again")
	case d.Outcome == templates.DeliveryLaunched:
		writeJSON(w, http.StatusAccepted, d)
	default:
		writeJSON(w, http.StatusOK, d)
	}
}
