package console

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// ---- Launch of a template: its survey's typed prompts and the overrides
// it asks for on launch, posted to the API's POST /templates/{id}/launch.
// A secret answer goes to the API only: it is never put back into the
// page, not even when the launch is refused.

// surveyField is a survey question as the launch form asks it.
type surveyField struct {
	// Name is the form's field, "survey.<variable>" (the API's error
	// field too).
	Name, Label, Help string
	// Input is "text", "number", "select", "checkboxes" or "password".
	Input    string
	Required bool
	Choices  []string
	Min, Max string // an integer's bounds, "" when none
}

// surveyFields are the launch form's fields of the questions qs.
func surveyFields(qs []templates.Question) []surveyField {
	out := make([]surveyField, 0, len(qs))
	for _, q := range qs {
		f := surveyField{Name: "survey." + q.Variable, Label: q.Label, Required: q.Required, Choices: q.Choices}
		if f.Label == "" {
			f.Label = q.Variable
		}
		var help []string
		if q.Description != "" {
			help = append(help, q.Description)
		}
		switch q.Type {
		case templates.Integer:
			f.Input = "number"
			if q.Min != nil {
				f.Min = strconv.FormatInt(*q.Min, 10)
			}
			if q.Max != nil {
				f.Max = strconv.FormatInt(*q.Max, 10)
			}
			if f.Min != "" || f.Max != "" {
				help = append(help, "a whole number within "+cmpOr(f.Min, "any")+"-"+cmpOr(f.Max, "any"))
			} else {
				help = append(help, "a whole number")
			}
		case templates.Choice:
			f.Input = "select"
		case templates.MultiChoice:
			f.Input = "checkboxes"
		case templates.Secret:
			f.Input = "password"
			help = append(help, "secret: written to Vault for this run only, never shown again")
		default:
			f.Input = "text"
			if q.MinLength != nil || q.MaxLength != nil {
				help = append(help, fmt.Sprintf("%d-%d characters", deref(q.MinLength, 0), deref(q.MaxLength, 4096)))
			}
		}
		if q.Required {
			help = append(help, "required")
		} else if q.Default == nil {
			help = append(help, "optional")
		}
		f.Help = strings.Join(help, "; ")
		out = append(out, f)
	}
	return out
}

func cmpOr(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

func deref(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

// launchAliases are the API's fields of a launched job's request that
// are the launch form's overrides.
var launchAliases = map[string]string{"options.limit": "limit", "options.tags": "tags", "options.skip_tags": "skip_tags",
	"options.extra_vars": "extra_vars", "source.ref": "ref", "options.verbosity": "verbosity", "options.check": "check",
	"options.diff": "diff", "options.callback_url": "callback_url"}

// launchFields are the launch form's override fields: what t asks for on
// launch, then the job's own settings.
func launchFields(a templates.Ask) []formField {
	var out []formField
	if a.Limit {
		out = append(out, formField{Name: "limit", Label: "Limit", Help: "a host pattern; empty: every host"})
	}
	if a.Tags {
		out = append(out, formField{Name: "tags", Label: "Tags", Help: "comma-separated"},
			formField{Name: "skip_tags", Label: "Skip tags", Help: "comma-separated"})
	}
	if a.Ref {
		out = append(out, formField{Name: "ref", Label: "Ref", Help: "a branch, tag or commit of the source; empty: the template's"})
	}
	if a.Inventory {
		out = append(out, formField{Name: "inventory", Label: "Inventory", Type: "textarea",
			Help: "YAML or JSON: an inventory as a job's (type, hosts, …); empty: the template's"})
	}
	if a.ExtraVars {
		out = append(out, formField{Name: "extra_vars", Label: "Extra variables", Type: "textarea",
			Help: "YAML or JSON: a mapping, over the template's"})
	}
	if a.Check {
		out = append(out, formField{Name: "check", Label: "Check mode (dry run)", Type: "checkbox"},
			formField{Name: "diff", Label: "Show diffs", Type: "checkbox"})
	}
	if a.Verbosity {
		out = append(out, formField{Name: "verbosity", Label: "Verbosity", Help: "0 to 4 (-v to -vvvv)"})
	}
	return append(out, formField{Name: "correlation_id", Label: "Correlation id", Help: "optional"},
		formField{Name: "callback_url", Label: "Callback URL", Help: "optional webhook on completion"})
}

// launchValues are the form's first values: the template's own settings
// for what may be overridden, and the survey's defaults.
func launchValues(t *templates.Template) (map[string]string, map[string][]string) {
	o := t.Job.Options
	vals := map[string]string{"limit": o.Limit, "tags": strings.Join(o.Tags, ", "), "skip_tags": strings.Join(o.SkipTags, ", "),
		"ref": t.Job.Source.Ref}
	if o.Check {
		vals["check"] = "on"
	}
	if o.Diff {
		vals["diff"] = "on"
	}
	if o.Verbosity > 0 {
		vals["verbosity"] = strconv.Itoa(o.Verbosity)
	}
	multi := map[string][]string{}
	for _, q := range t.Survey {
		switch d := q.Default.(type) {
		case nil:
		case []any:
			for _, v := range d {
				multi["survey."+q.Variable] = append(multi["survey."+q.Variable], fmt.Sprint(v))
			}
		default:
			vals["survey."+q.Variable] = fmt.Sprint(d)
		}
	}
	return vals, multi
}

// mayLaunch answers 403 unless the key has templates:launch.
func (c *Console) mayLaunch(w http.ResponseWriter, r *http.Request) bool {
	return c.require(w, r, auth.ScopeTemplatesLaunch, "Launching templates")
}

// launchTemplate reads the version of the template to launch (the form's
// own, else ?version=, else the current one).
func (c *Console) launchTemplate(w http.ResponseWriter, r *http.Request, version string) (*templates.Template, bool) {
	path := templatePath(chi.URLParam(r, "id"))
	if version != "" {
		path += "?version=" + url.QueryEscape(version)
	}
	var t templates.Template
	res, err := c.call(r, http.MethodGet, path, nil, &t)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return nil, false
	}
	return &t, true
}

func (c *Console) launchForm(w http.ResponseWriter, r *http.Request) {
	if !c.mayLaunch(w, r) {
		return
	}
	t, ok := c.launchTemplate(w, r, r.URL.Query().Get("version"))
	if !ok {
		return
	}
	vals, multi := launchValues(t)
	c.renderLaunch(w, r, http.StatusOK, t, vals, multi, nil, "")
}

// renderLaunch shows t's launch form with vals (multi: the multiple
// choices' checked answers) and its errors, by field and general.
func (c *Console) renderLaunch(w http.ResponseWriter, r *http.Request, status int, t *templates.Template,
	vals map[string]string, multi map[string][]string, errs map[string]string, general string) {
	c.render(w, r, status, "launch", map[string]any{"Title": "Launch " + t.Name, "T": t,
		"Fields": launchFields(t.Ask), "Survey": surveyFields(t.Survey), "Values": vals, "Multi": multi,
		"Errors": errs, "General": general, "HasSecret": slices.ContainsFunc(t.Survey, func(q templates.Question) bool {
			return q.Type == templates.Secret
		})})
}

// launchRequest builds the API's launch from the form; errs gets what the
// form itself cannot read (numbers, YAML), by field. Secret answers are
// in the launch only, never in vals.
func launchRequest(t *templates.Template, form url.Values, vals map[string]string, multi map[string][]string, errs map[string]string) templates.Launch {
	l := templates.Launch{Version: t.Version, CorrelationID: vals["correlation_id"], CallbackURL: vals["callback_url"]}
	a := t.Ask
	if a.Limit {
		limit := vals["limit"]
		l.Limit = &limit
	}
	if a.Tags {
		l.Tags, l.SkipTags = commaList(vals["tags"]), commaList(vals["skip_tags"])
	}
	if a.Ref {
		l.Ref = vals["ref"]
	}
	if a.Check {
		check, diff := vals["check"] == "on", vals["diff"] == "on"
		l.Check, l.Diff = &check, &diff
	}
	if a.Verbosity && vals["verbosity"] != "" {
		n, err := strconv.Atoi(vals["verbosity"])
		if err != nil {
			errs["verbosity"] = "must be a whole number"
		}
		l.Verbosity = &n
	}
	if a.ExtraVars && vals["extra_vars"] != "" {
		if err := decodeYAMLAsJSON(vals["extra_vars"], &l.ExtraVars); err != nil {
			errs["extra_vars"] = "must be YAML or JSON: a mapping of variable names to values"
		}
	}
	if a.Inventory && vals["inventory"] != "" {
		var inv deployments.JobInventory
		if err := decodeYAMLAsJSON(vals["inventory"], &inv); err != nil {
			errs["inventory"] = "must be YAML or JSON: an inventory (type, hosts, …)"
		}
		l.Inventory = &inv
	}
	l.Survey = map[string]any{}
	for _, q := range t.Survey {
		name := "survey." + q.Variable
		switch q.Type {
		case templates.MultiChoice:
			list := []any{}
			for _, v := range multi[name] {
				list = append(list, v)
			}
			l.Survey[q.Variable] = list
		case templates.Secret:
			if v := form.Get(name); v != "" {
				l.Survey[q.Variable] = v
			}
		case templates.Integer:
			if v := vals[name]; v != "" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					errs[name] = "must be a whole number"
				}
				l.Survey[q.Variable] = n
			}
		default:
			if v := vals[name]; v != "" {
				l.Survey[q.Variable] = v
			}
		}
	}
	return l
}

// commaList is a comma-separated list's items, trimmed; nil when none.
func commaList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func (c *Console) launchSubmit(w http.ResponseWriter, r *http.Request) {
	if !c.mayLaunch(w, r) {
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Bad form.")
		return
	}
	t, ok := c.launchTemplate(w, r, r.PostFormValue("version"))
	if !ok {
		return
	}
	var names []string
	for _, f := range launchFields(t.Ask) {
		names = append(names, f.Name)
	}
	vals, multi := map[string]string{}, map[string][]string{}
	for _, n := range names {
		vals[n] = strings.TrimSpace(r.PostFormValue(n))
	}
	for _, q := range t.Survey {
		name := "survey." + q.Variable
		names = append(names, name)
		switch q.Type {
		case templates.Secret: // never kept for the page
		case templates.MultiChoice:
			multi[name] = r.PostForm[name]
		default:
			vals[name] = strings.TrimSpace(r.PostFormValue(name))
		}
	}
	errs := map[string]string{}
	l := launchRequest(t, r.PostForm, vals, multi, errs)
	if len(errs) > 0 {
		c.renderLaunch(w, r, http.StatusUnprocessableEntity, t, vals, multi, errs, "Correct the fields marked below.")
		return
	}
	var j jobView
	res, err := c.call(r, http.MethodPost, templatePath(t.ID)+"/launch", l, &j)
	if err != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if res.Problem != nil {
		general := problemFields(res.Problem, errs, func(field string) string {
			if alias, ok := launchAliases[field]; ok {
				field = alias
			}
			if f := formFieldOf(names, field); slices.Contains(names, f) {
				return f
			}
			return ""
		})
		c.renderLaunch(w, r, res.Status, t, vals, multi, errs, general)
		return
	}
	http.Redirect(w, r, Prefix+"/runs/job/"+url.PathEscape(j.ID)+"?done="+url.QueryEscape("launched "+t.Name), http.StatusSeeOther)
}
