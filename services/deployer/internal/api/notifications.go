package api

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// NotificationRuleList is the answer of GET /notifications and of GET
// /templates/{id}/notifications.
type NotificationRuleList struct {
	Items []*templates.Rule `json:"items"`
}

// servesNotifications answers 503 when this deployer has no notification
// rules.
func (a *API) servesNotifications(w http.ResponseWriter, r *http.Request) bool {
	if a.deps.Notifications == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "notification rules are not served by this deployer")
		return false
	}
	return true
}

// ruleError answers err of the notification rules and reports whether it
// did.
func (a *API) ruleError(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case errors.Is(err, templates.ErrRuleExists):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a notification rule of this name exists in the project",
			FieldProblem{Field: "name", Message: "taken in this project"})
	case errors.Is(err, templates.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no notification rule (or template) has this id")
	default:
		return a.templateError(w, r, err)
	}
	return true
}

// createRule serves POST /notifications and, with the template of the
// path, POST /templates/{id}/notifications.
func (a *API) createRule(w http.ResponseWriter, r *http.Request) {
	if !a.servesNotifications(w, r) {
		return
	}
	var req templates.NewRule
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	if id := chi.URLParam(r, "id"); id != "" {
		req.TemplateID = id
	} else if req.TemplateID == "" {
		req.ProjectID = keyProject(key, req.ProjectID)
	}
	rule, err := a.deps.Notifications.CreateRule(r.Context(), key.ID, visibility(key), req)
	if a.ruleError(w, r, err) {
		return
	}
	w.Header().Set("Location", "/api/v1/notifications/"+rule.ID)
	writeJSON(w, http.StatusCreated, rule)
}

// listRules serves GET /notifications (?project_id=, ?template_id=) and
// GET /templates/{id}/notifications (the template's rules and its
// project's).
func (a *API) listRules(w http.ResponseWriter, r *http.Request) {
	if !a.servesNotifications(w, r) {
		return
	}
	q := r.URL.Query()
	for name := range q {
		if name != "project_id" && name != "template_id" {
			writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, "unknown query parameter",
				FieldProblem{Field: "query", Message: "only project_id and template_id are known"})
			return
		}
	}
	template := q.Get("template_id")
	if id := chi.URLParam(r, "id"); id != "" {
		template = id
	}
	key := authedKey(r.Context())
	list, err := a.deps.Notifications.ListRules(r.Context(), visibility(key), q.Get("project_id"), template)
	if a.ruleError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, NotificationRuleList{Items: orEmpty(list)})
}

func (a *API) getRule(w http.ResponseWriter, r *http.Request) {
	if !a.servesNotifications(w, r) {
		return
	}
	key := authedKey(r.Context())
	rule, err := a.deps.Notifications.GetRule(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if a.ruleError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, rule)
}

func (a *API) updateRule(w http.ResponseWriter, r *http.Request) {
	if !a.servesNotifications(w, r) {
		return
	}
	var req templates.NewRule
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	rule, err := a.deps.Notifications.UpdateRule(r.Context(), visibility(key), chi.URLParam(r, "id"), req)
	if a.ruleError(w, r, err) {
		return
	}
	writeJSON(w, http.StatusOK, rule)
}

func (a *API) deleteRule(w http.ResponseWriter, r *http.Request) {
	if !a.servesNotifications(w, r) {
		return
	}
	key := authedKey(r.Context())
	if a.ruleError(w, r, a.deps.Notifications.DeleteRule(r.Context(), visibility(key), chi.URLParam(r, "id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
