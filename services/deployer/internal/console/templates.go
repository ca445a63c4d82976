package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// ---- Templates: a project's job templates, their versions, schedules
// and triggers, through the API's /templates, /schedules and /triggers as
// the session's key (another project's template is 404, as in the API).

// recentScan is how many of the project's latest jobs the template page
// looks through for the ones the template launched (the jobs API has no
// filter by template); recentShown how many of those it shows.
const (
	recentScan  = 100
	recentShown = 10
)

// mayReadTemplates answers 403 unless the key has templates:read (or
// templates:launch, which grants it).
func (c *Console) mayReadTemplates(w http.ResponseWriter, r *http.Request) bool {
	return c.require(w, r, auth.ScopeTemplatesRead, "Reading templates")
}

func (c *Console) templatesPage(w http.ResponseWriter, r *http.Request) {
	if !c.mayReadTemplates(w, r) {
		return
	}
	var list api.TemplateList
	res, err := c.call(r, http.MethodGet, "/api/v1/templates", nil, &list)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	c.render(w, r, http.StatusOK, "templates", map[string]any{"Title": "Templates", "Templates": list.Items,
		"CanLaunch": c.key(r).Has(auth.ScopeTemplatesLaunch)})
}

// templatePath is the API's path of template id.
func templatePath(id string) string { return "/api/v1/templates/" + url.PathEscape(id) }

// templateForms are what the template page's forms hold back after a
// refusal, and a trigger's secret to show once.
type templateForms struct {
	Schedule, Trigger map[string]string
	ScheduleError     string
	TriggerError      string
	// Secret is a trigger's new webhook secret, shown this once.
	Secret *templates.Trigger
}

func (c *Console) templatePage(w http.ResponseWriter, r *http.Request) {
	c.renderTemplate(w, r, http.StatusOK, chi.URLParam(r, "id"), templateForms{})
}

// renderTemplate shows template id: the version asked for (?version=),
// its definition and survey, its versions, its schedules and triggers,
// and the jobs it launched lately.
func (c *Console) renderTemplate(w http.ResponseWriter, r *http.Request, status int, id string, forms templateForms) {
	if !c.mayReadTemplates(w, r) {
		return
	}
	path := templatePath(id)
	if v := r.URL.Query().Get("version"); v != "" {
		path += "?version=" + url.QueryEscape(v)
	}
	var t templates.Template
	res, err := c.call(r, http.MethodGet, path, nil, &t)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	var versions api.TemplateList
	var schedules api.ScheduleList
	var triggers api.TriggerList
	for _, part := range []struct {
		path string
		out  any
	}{{"/versions", &versions}, {"/schedules", &schedules}, {"/triggers", &triggers}} {
		res, err := c.call(r, http.MethodGet, templatePath(t.ID)+part.path, nil, part.out)
		// A deployer without triggers (no signing key) lists none.
		if err != nil || (res.Problem != nil && part.path != "/triggers") {
			c.failAPI(w, r, res, err)
			return
		}
	}
	job, _ := json.MarshalIndent(t.Job, "", "  ")
	key := c.key(r)
	if forms.Schedule == nil {
		forms.Schedule = map[string]string{"timezone": "UTC", "missed": "skip"}
	}
	if forms.Trigger == nil {
		forms.Trigger = map[string]string{"provider": "github"}
	}
	c.render(w, r, status, "template", map[string]any{"Title": "Template " + t.Name, "T": t, "Job": string(job),
		"Asked": askedOnLaunch(t.Ask), "Versions": versions.Items, "Schedules": schedules.Items, "Triggers": triggers.Items, "HookBase": c.hookBase(r),
		"Jobs": c.templateJobs(r, &t), "Forms": forms, "Current": t.Version == t.Latest,
		"CanWrite": key.Has(auth.ScopeTemplatesWrite), "CanLaunch": key.Has(auth.ScopeTemplatesLaunch),
		"CanSchedule": key.Has(auth.ScopeTemplatesWrite) && key.Has(auth.ScopeTemplatesLaunch),
		"Providers":   []string{string(templates.GitHub), string(templates.GitLab), string(templates.Gitea)}})
}

// hookBase is the API's address as the browser reaches it: a trigger's
// URL is a path below it.
func (c *Console) hookBase(r *http.Request) string {
	scheme := "http"
	if c.secure(r) {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// askedOnLaunch names what a launch may override.
func askedOnLaunch(a templates.Ask) []string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{a.Limit, "limit"}, {a.Tags, "tags"}, {a.ExtraVars, "extra variables"}, {a.Inventory, "inventory"},
		{a.Ref, "ref"}, {a.Check, "check and diff"}, {a.Verbosity, "verbosity"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	return out
}

// templateJobs are the latest jobs template t launched, among its
// project's last recentScan jobs; none for a key without jobs:read.
func (c *Console) templateJobs(r *http.Request, t *templates.Template) []Run {
	if !c.key(r).Has(auth.ScopeJobsRead) {
		return nil
	}
	var list struct {
		Items []jobView `json:"items"`
	}
	q := url.Values{"project_id": {t.ProjectID}, "limit": {strconv.Itoa(recentScan)}}
	if res, err := c.call(r, http.MethodGet, "/api/v1/jobs?"+q.Encode(), nil, &list); err != nil || res.Problem != nil {
		return nil
	}
	var out []Run
	for _, j := range list.Items {
		if tr := j.Request.Template; tr != nil && tr.ID == t.ID && len(out) < recentShown {
			out = append(out, Run{Kind: "job", ID: j.ID, Status: string(j.Status), CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt,
				Link: Prefix + "/runs/job/" + j.ID, What: "version " + strconv.Itoa(tr.Version), Target: jobTarget(&j.Request)})
		}
	}
	return out
}

// ---- Relaunch of a finished job

// relaunchJob runs a finished job again through the API's POST
// /jobs/{id}/relaunch (hosts: all, or failed: its failed and unreachable
// hosts only), and goes to the new job's page.
func (c *Console) relaunchJob(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	hosts := r.PostFormValue("hosts")
	var j jobView
	res, err := c.call(r, http.MethodPost, "/api/v1/jobs/"+url.PathEscape(id)+"/relaunch", map[string]string{"hosts": hosts}, &j)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, Prefix+"/runs/job/"+url.PathEscape(j.ID)+"?done="+url.QueryEscape("relaunched job "+id), http.StatusSeeOther)
}

// failedHosts reports whether a finished job's recap names a host that
// failed or was unreachable (what a relaunch on the failed hosts runs).
func failedHosts(j *jobView) bool {
	if j.Result == nil {
		return false
	}
	for _, h := range j.Result.Hosts {
		if h.Failed > 0 || h.Unreachable > 0 {
			return true
		}
	}
	return false
}

// relaunchable reports whether the relaunch form fits the job: it ended
// and the deployer holds its request (it came through the API).
func relaunchable(j *jobView) bool {
	return j.Status.Terminal() && j.Request.Source.Type != ""
}
