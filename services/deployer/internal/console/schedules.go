package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// ---- A template's schedules and triggers, on its page: made, paused,
// resumed, rotated and deleted through the API as the session's key. A
// trigger's webhook secret is shown once, in the answer to the POST that
// made or rotated it (no-store, as every page), never again.

// formOf reads the posted fields names, trimmed.
func formOf(r *http.Request, names ...string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		out[n] = strings.TrimSpace(r.PostFormValue(n))
	}
	return out
}

// refused shows what the API refused of a form of template id's page, and
// reports whether it did: the page again with forms(the refusal), or an
// error page (no such template, as another project's is: 404).
func (c *Console) refused(w http.ResponseWriter, r *http.Request, res *apiResult, err error, id string,
	forms func(msg string) templateForms) bool {
	switch {
	case err != nil, res.Problem != nil && res.Status == http.StatusNotFound:
		c.failAPI(w, r, res, err)
	case res.Problem != nil:
		c.renderTemplate(w, r, res.Status, id, forms(problemText(res.Problem)))
	default:
		return false
	}
	return true
}

func (c *Console) createSchedule(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	form := formOf(r, "name", "cron", "rrule", "timezone", "missed")
	n := templates.NewSchedule{Name: form["name"], Cron: form["cron"], RRule: form["rrule"], Timezone: form["timezone"]}
	n.Missed = schedule.Missed(form["missed"])
	res, err := c.call(r, http.MethodPost, templatePath(id)+"/schedules", n, nil)
	if c.refused(w, r, res, err, id, func(msg string) templateForms { return templateForms{Schedule: form, ScheduleError: msg} }) {
		return
	}
	http.Redirect(w, r, Prefix+"/templates/"+url.PathEscape(id)+"?done="+url.QueryEscape("scheduled "+form["name"])+"#schedules",
		http.StatusSeeOther)
}

// scheduleOf reads the route's schedule as the session's key.
func (c *Console) scheduleOf(w http.ResponseWriter, r *http.Request) (*templates.Schedule, bool) {
	var sc templates.Schedule
	res, err := c.call(r, http.MethodGet, "/api/v1/schedules/"+url.PathEscape(chi.URLParam(r, "id")), nil, &sc)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return nil, false
	}
	return &sc, true
}

// scheduleAction pauses, resumes or (confirmed) deletes the route's
// schedule and goes back to its template's page.
func (c *Console) scheduleAction(w http.ResponseWriter, r *http.Request) {
	sc, ok := c.scheduleOf(w, r)
	if !ok {
		return
	}
	path, back := "/api/v1/schedules/"+url.PathEscape(sc.ID), Prefix+"/templates/"+url.PathEscape(sc.TemplateID)
	method, done := http.MethodPost, ""
	switch op := chi.URLParam(r, "op"); op {
	case "pause", "resume":
		path, done = path+"/"+op, op+"d "+sc.Name
	case "delete":
		if !confirmed(r) {
			c.confirm(w, r, confirmation{Question: "Delete schedule " + sc.Name + "?",
				Warning: "It launches nothing from now on; the jobs it launched stay.",
				Action:  Prefix + "/schedules/" + url.PathEscape(sc.ID) + "/delete",
				Button:  "Delete it", ButtonID: "confirm-delete", Cancel: back})
			return
		}
		method, done = http.MethodDelete, "deleted "+sc.Name
	default:
		c.fail(w, r, http.StatusNotFound, "There is no such page.")
		return
	}
	res, err := c.call(r, method, path, nil, nil)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, back+"?done="+url.QueryEscape(done)+"#schedules", http.StatusSeeOther)
}

func (c *Console) createTrigger(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	form := formOf(r, "name", "provider", "branches", "tags")
	n := templates.NewTrigger{Name: form["name"], Provider: templates.Provider(form["provider"]),
		Branches: commaList(form["branches"]), Tags: commaList(form["tags"])}
	var tr templates.Trigger
	res, err := c.call(r, http.MethodPost, templatePath(id)+"/triggers", n, &tr)
	if c.refused(w, r, res, err, id, func(msg string) templateForms { return templateForms{Trigger: form, TriggerError: msg} }) {
		return
	}
	c.renderTemplate(w, r, http.StatusCreated, id, templateForms{Secret: &tr})
}

// triggerAction rotates the secret of, or deletes, the route's trigger
// (each confirmed first: the secret git hosting holds stops working).
func (c *Console) triggerAction(w http.ResponseWriter, r *http.Request) {
	var tr templates.Trigger
	res, err := c.call(r, http.MethodGet, "/api/v1/triggers/"+url.PathEscape(chi.URLParam(r, "id")), nil, &tr)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	path, back := "/api/v1/triggers/"+url.PathEscape(tr.ID), Prefix+"/templates/"+url.PathEscape(tr.TemplateID)
	cf := confirmation{Action: Prefix + "/triggers/" + url.PathEscape(tr.ID) + "/" + chi.URLParam(r, "op"), Cancel: back}
	switch chi.URLParam(r, "op") {
	case "rotate":
		cf.Question, cf.Button, cf.ButtonID = "Rotate the secret of trigger "+tr.Name+"?", "Rotate it", "confirm-rotate"
		cf.Warning = "The secret git hosting holds stops working at once: deliveries are refused until it has the new one."
	case "delete":
		cf.Question, cf.Button, cf.ButtonID = "Delete trigger "+tr.Name+"?", "Delete it", "confirm-delete"
		cf.Warning = "Its URL answers 404 from now on; the jobs it launched stay."
	default:
		c.fail(w, r, http.StatusNotFound, "There is no such page.")
		return
	}
	if !confirmed(r) {
		c.confirm(w, r, cf)
		return
	}
	if chi.URLParam(r, "op") == "delete" {
		res, err := c.call(r, http.MethodDelete, path, nil, nil)
		if err != nil || res.Problem != nil {
			c.failAPI(w, r, res, err)
			return
		}
		http.Redirect(w, r, back+"?done="+url.QueryEscape("deleted "+tr.Name)+"#triggers", http.StatusSeeOther)
		return
	}
	var rotated templates.Trigger
	res, err = c.call(r, http.MethodPost, path+"/rotate", nil, &rotated)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	c.renderTemplate(w, r, http.StatusOK, tr.TemplateID, templateForms{Secret: &rotated})
}
