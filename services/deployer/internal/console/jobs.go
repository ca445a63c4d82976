package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
	"go.yaml.in/yaml/v3"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// ---- A job's page

// jobPage shows an Ansible job as GET /api/v1/jobs/{id} does for the
// session's key (jobs:read, its projects: another project's job is 404).
func (c *Console) jobPage(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	base := "/api/v1/jobs/" + url.PathEscape(id)
	var j jobView
	res, err := c.call(r, http.MethodGet, base, nil, &j)
	if err == nil && res.Problem == nil && j.Kind != deployments.KindJob {
		// The jobs API answers a deployment's id too: show it as one.
		http.Redirect(w, r, Prefix+"/runs/deployment/"+url.PathEscape(j.ID), http.StatusSeeOther)
		return
	}
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	data := map[string]any{"Title": "Job " + j.ID, "J": j, "Terminal": j.Status.Terminal(),
		"What": jobWhat(&j.Request), "Hosts": j.Request.HostNames(), "Relaunch": relaunchable(&j), "FailedHosts": failedHosts(&j)}
	if len(j.Request.Options.ExtraVars) > 0 {
		if b, err := json.MarshalIndent(j.Request.Options.ExtraVars, "", "  "); err == nil {
			data["ExtraVars"] = string(b)
		}
	}
	data["Noun"], data["LogURL"], data["EventsURL"] = "job", Prefix+"/runs/job/"+j.ID+"/logs", Prefix+"/runs/job/"+j.ID+"/stream"
	c.runDetails(r, data, "/api/v1/deployments/"+url.PathEscape(id)+"/webhooks", base+"/logs", j.Status.Terminal())
	c.render(w, r, http.StatusOK, "job", data)
}

// jobPassthrough serves the API's job event stream or log as the
// session's key.
func (c *Console) jobPassthrough(what string) http.HandlerFunc {
	return c.passthrough("/api/v1/jobs/", what)
}

func (c *Console) cancelJob(w http.ResponseWriter, r *http.Request) {
	c.cancelRun(w, r, "/api/v1/jobs/", Prefix+"/runs/job/")
}

// ---- New job

// formField is a field of a form, named as the API names it.
type formField struct {
	Name, Label, Help string
	Type              string // "" (text), "textarea", "checkbox", "select"
	Options           []string
	Placeholder       string // an example shown in an empty field, never a value
	// For lists the values of the select ForField (default source.type)
	// the field is for (empty: all); the console's script hides the
	// field while another is chosen.
	For      []string
	ForField string
	// Credential: the field names a stored credential; the form offers
	// the project's credentials' names (a datalist: typing a reference
	// still works).
	Credential bool
}

// fieldInput is a form's field with its value and error, as the
// formfield template shows it.
type fieldInput struct {
	formField
	Value, Err string
	// Suggest: the field offers the credentials' names (a datalist).
	Suggest bool
}

// newFieldInput is field f of a form with values vals and errors errs;
// creds are the credentials' names the form offers.
func newFieldInput(f formField, vals, errs map[string]string, creds []string) fieldInput {
	return fieldInput{formField: f, Value: vals[f.Name], Err: errs[f.Name], Suggest: f.Credential && len(creds) > 0}
}

// fieldGroup is a fieldset of a form.
type fieldGroup struct {
	Legend string
	Fields []formField
}

// jobFields are the job form's fields, in order, grouped by the API's
// request keys.
var jobFields = []fieldGroup{
	{"Job", []formField{
		{Name: "project_id", Label: "Project", Help: "the project (a UUID) the job belongs to"},
		{Name: "correlation_id", Label: "Correlation id", Help: "optional"},
	}},
	{"Source", []formField{
		{Name: "source.type", Label: "Type", Help: "a playbook repository, a role in a repository, or a collection's role",
			Type: "select", Options: []string{"playbook", "role", "collection_role"}},
		{Name: "source.repository", Label: "Repository", Help: "the git repository's URL",
			Placeholder: "https://git.example.com/org/playbooks.git", For: []string{"playbook", "role"}},
		{Name: "source.ref", Label: "Ref", Help: "a branch, tag or commit; empty: the default branch", For: []string{"playbook", "role"}},
		{Name: "source.paths", Label: "Playbooks", Help: "paths in the repository, comma-separated, run in order",
			Placeholder: "site.yml", For: []string{"playbook"}},
		{Name: "source.role_path", Label: "Role path", Help: "the role's path in the repository", For: []string{"role"}},
		{Name: "source.collection", Label: "Collection", Help: "namespace.collection", Placeholder: "community.general",
			For: []string{"collection_role"}},
		{Name: "source.role", Label: "Role", Help: "the role's name", For: []string{"collection_role"}},
		{Name: "source.version", Label: "Collection version", Help: "optional", For: []string{"collection_role"}},
		{Name: "source.git_credential", Label: "Git credential", Help: "a stored credential's name (or a secret reference)",
			For: []string{"playbook", "role"}, Credential: true},
	}},
	{"Inventory", []formField{
		{Name: "inventory.type", Label: "Type", Help: "hosts listed here, a file in a git repository, a file at a URL, or an inventory plugin",
			Type: "select", Options: []string{"inline", "git", "url", "dynamic"}},
		{Name: "inventory.hosts", Label: "Hosts", Type: "textarea",
			Help: "YAML or JSON: host names with their variables ({web-1: {ansible_host: 192.0.2.10}}), or a list of names",
			For:  []string{"inline"}, ForField: "inventory.type"},
		{Name: "inventory.repository", Label: "Inventory repository", Help: "the git repository's URL",
			Placeholder: "https://git.example.com/org/inventory.git", For: []string{"git"}, ForField: "inventory.type"},
		{Name: "inventory.ref", Label: "Inventory ref", Help: "a branch, tag or commit; empty: the default branch",
			For: []string{"git"}, ForField: "inventory.type"},
		{Name: "inventory.path", Label: "Inventory path", Help: "the inventory file's path in the repository",
			Placeholder: "hosts.yml", For: []string{"git"}, ForField: "inventory.type"},
		{Name: "inventory.url", Label: "Inventory URL", Help: "where the inventory file is served",
			Placeholder: "https://cmdb.example.com/inventory.yml", For: []string{"url"}, ForField: "inventory.type"},
		{Name: "inventory.credential", Label: "Inventory credential", Help: "optional: a stored credential's name for the repository or URL",
			For: []string{"git", "url"}, ForField: "inventory.type", Credential: true},
		{Name: "inventory.plugin", Label: "Plugin", Help: "the inventory plugin's name",
			Placeholder: "amazon.aws.aws_ec2", For: []string{"dynamic"}, ForField: "inventory.type"},
		{Name: "inventory.config", Label: "Plugin configuration", Type: "textarea", Help: "YAML or JSON: a mapping",
			For: []string{"dynamic"}, ForField: "inventory.type"},
	}},
	{"Credentials", []formField{
		{Name: "credentials.ssh", Label: "SSH key", Help: "a stored credential's name (or a secret reference)", Credential: true},
		{Name: "credentials.become_password", Label: "Become password", Help: "optional: a stored credential's name", Credential: true},
		{Name: "credentials.vault_password", Label: "Vault password", Help: "optional: a stored credential's name", Credential: true},
	}},
	{"Options", []formField{
		{Name: "options.tags", Label: "Tags", Help: "comma-separated"},
		{Name: "options.skip_tags", Label: "Skip tags", Help: "comma-separated"},
		{Name: "options.limit", Label: "Limit", Help: "a host pattern"},
		{Name: "options.forks", Label: "Forks", Help: "hosts worked on at once; empty: Ansible's default"},
		{Name: "options.pool", Label: "Pool", Help: "optional: the infra pool to run on (one granted to the project)"},
		{Name: "options.check", Label: "Check mode (dry run)", Type: "checkbox"},
		{Name: "options.diff", Label: "Show diffs", Type: "checkbox"},
		{Name: "options.verbosity", Label: "Verbosity", Help: "0 to 4 (-v to -vvvv)"},
		{Name: "options.timeout", Label: "Timeout (seconds)", Help: "empty: infra's limit"},
		{Name: "options.extra_vars", Label: "Extra variables", Type: "textarea", Help: "YAML or JSON: a mapping"},
		{Name: "options.callback_url", Label: "Callback URL", Help: "optional webhook on completion"},
	}},
}

// jobFieldNames are the form's field names.
func jobFieldNames() []string {
	var names []string
	for _, g := range jobFields {
		for _, f := range g.Fields {
			names = append(names, f.Name)
		}
	}
	return names
}

// mayRunJobs answers 403 unless the key has jobs:write: the form is
// offered to such keys only (the API would refuse the post anyway).
func (c *Console) mayRunJobs(w http.ResponseWriter, r *http.Request) bool {
	return c.require(w, r, auth.ScopeJobsWrite, "Running jobs")
}

// require answers 403 unless the session's key has scope: what (a page
// or an action) needs it.
func (c *Console) require(w http.ResponseWriter, r *http.Request, scope auth.Scope, what string) bool {
	if c.key(r).Has(scope) {
		return true
	}
	c.fail(w, r, http.StatusForbidden, what+" needs the scope "+string(scope)+".")
	return false
}

func (c *Console) jobForm(w http.ResponseWriter, r *http.Request) {
	if !c.mayRunJobs(w, r) {
		return
	}
	vals := map[string]string{"source.type": "playbook"}
	if ps := c.key(r).Projects; len(ps) > 0 {
		vals["project_id"] = ps[0]
	}
	note := ""
	if from := r.URL.Query().Get("from"); from != "" {
		// Run again: the form filled in with that job's request, as the
		// API gives it to this key (another project's job: 404).
		var j jobView
		res, err := c.call(r, http.MethodGet, "/api/v1/jobs/"+url.PathEscape(from), nil, &j)
		if err != nil || res.Problem != nil {
			c.failAPI(w, r, res, err)
			return
		}
		vals, note = jobFormValues(&j.Request)
		if note == "" {
			note = "Filled in from job " + j.ID + "."
		}
	}
	c.renderJob(w, r, http.StatusOK, vals, nil, "", note)
}

// jobFormValues are the job form's values of req (jobRequest's reverse,
// for "Run again"), and a note on what the form cannot hold (it was left
// out), or "".
func jobFormValues(req *deployments.JobRequest) (map[string]string, string) {
	s, o, cr := req.Source, req.Options, req.Credentials
	vals := map[string]string{"project_id": req.ProjectID, "source.type": s.Type, "source.repository": s.Repository,
		"source.ref": s.Ref, "source.paths": strings.Join(s.Paths, ", "), "source.git_credential": s.GitCredential,
		"source.role_path": s.RolePath, "source.collection": s.Collection, "source.role": s.Role, "source.version": s.Version,
		"credentials.ssh": cr.SSH, "credentials.become_password": cr.BecomePassword, "credentials.vault_password": cr.VaultPassword,
		"options.tags": strings.Join(o.Tags, ", "), "options.skip_tags": strings.Join(o.SkipTags, ", "), "options.limit": o.Limit,
		"options.callback_url": o.CallbackURL, "options.pool": o.Pool,
		"inventory.type": req.Inventory.Type, "inventory.repository": req.Inventory.Repository, "inventory.ref": req.Inventory.Ref,
		"inventory.path": req.Inventory.Path, "inventory.url": req.Inventory.URL, "inventory.credential": req.Inventory.Credential,
		"inventory.plugin": req.Inventory.Plugin}
	for name, on := range map[string]bool{"options.check": o.Check, "options.diff": o.Diff} {
		if on {
			vals[name] = "on"
		}
	}
	for name, n := range map[string]int{"options.verbosity": o.Verbosity, "options.timeout": o.Timeout, "options.forks": o.Forks} {
		if n > 0 {
			vals[name] = strconv.Itoa(n)
		}
	}
	asYAML := func(name string, v any) {
		if b, err := yaml.Marshal(v); err == nil {
			vals[name] = string(b)
		}
	}
	if len(req.Inventory.Hosts) > 0 {
		asYAML("inventory.hosts", req.Inventory.Hosts)
	}
	if len(req.Inventory.Config) > 0 {
		asYAML("inventory.config", req.Inventory.Config)
	}
	if len(o.ExtraVars) > 0 {
		asYAML("options.extra_vars", o.ExtraVars)
	}
	var left []string
	if len(req.Inventory.Groups) > 0 {
		left = append(left, "its inventory groups")
	}
	if len(s.RoleVars) > 0 {
		left = append(left, "its role variables")
	}
	if s.GalaxyServer != "" {
		left = append(left, "its Galaxy server")
	}
	if cr.Cloud != "" || cr.Galaxy != "" {
		left = append(left, "its cloud and Galaxy credentials")
	}
	if len(left) == 0 {
		return vals, ""
	}
	return vals, "Filled in from the job; the form cannot hold " + strings.Join(left, ", ") + ": check the fields before you run it."
}

// renderJob shows the form with vals, its errors (by field, and general)
// and a note above it.
func (c *Console) renderJob(w http.ResponseWriter, r *http.Request, status int, vals, errs map[string]string, general, note string) {
	c.render(w, r, status, "jobform", map[string]any{"Title": "New job", "Groups": jobGroups(c.key(r).Projects),
		"Values": vals, "Errors": errs, "General": general, "Note": note, "Projects": c.key(r).Projects,
		"CredentialNames": c.credentialNames(r)})
}

// jobGroups are the job form's fields for a key of projects: with several,
// the project is picked from them.
func jobGroups(projects []string) []fieldGroup {
	if len(projects) < 2 {
		return jobFields
	}
	groups := slices.Clone(jobFields)
	for i, g := range groups {
		for j, f := range g.Fields {
			if f.Name == "project_id" {
				fields := slices.Clone(g.Fields)
				fields[j].Type, fields[j].Options, fields[j].Help = "select", projects, "one of this key's projects"
				groups[i].Fields = fields
			}
		}
	}
	return groups
}

// jobRequest builds the API's request from the form; errs gets what the
// form itself cannot read (numbers, YAML), by field.
func jobRequest(vals, errs map[string]string) deployments.JobRequest {
	list := func(name string) []string {
		var out []string
		for v := range strings.SplitSeq(vals[name], ",") {
			if v = strings.TrimSpace(v); v != "" {
				out = append(out, v)
			}
		}
		return out
	}
	req := deployments.JobRequest{ProjectID: vals["project_id"], CorrelationID: vals["correlation_id"],
		Source: deployments.JobSource{Type: vals["source.type"], Repository: vals["source.repository"], Ref: vals["source.ref"],
			Paths: list("source.paths"), GitCredential: vals["source.git_credential"], RolePath: vals["source.role_path"],
			Collection: vals["source.collection"], Role: vals["source.role"], Version: vals["source.version"]},
		Inventory: jobInventory(vals),
		Credentials: deployments.JobCredentials{SSH: vals["credentials.ssh"], BecomePassword: vals["credentials.become_password"],
			VaultPassword: vals["credentials.vault_password"]},
		Options: deployments.JobOptions{Tags: list("options.tags"), SkipTags: list("options.skip_tags"), Limit: vals["options.limit"],
			Check: vals["options.check"] == "on", Diff: vals["options.diff"] == "on", CallbackURL: vals["options.callback_url"]},
	}
	if req.Source.Type != "playbook" {
		req.Source.Paths = nil // shown filled in by default
	}
	req.Options.Pool = vals["options.pool"]
	for name, dst := range map[string]*int{"options.verbosity": &req.Options.Verbosity, "options.timeout": &req.Options.Timeout,
		"options.forks": &req.Options.Forks} {
		if v := vals[name]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs[name] = "must be a whole number"
				continue
			}
			*dst = n
		}
	}
	if v := vals["inventory.hosts"]; v != "" && req.Inventory.Type == "inline" {
		if err := decodeYAMLAsJSON(v, &req.Inventory.Hosts); err != nil {
			errs["inventory.hosts"] = "must be YAML or JSON: a mapping of host names to their variables, or a list of names"
		}
	}
	if v := vals["inventory.config"]; v != "" && req.Inventory.Type == "dynamic" {
		if err := decodeYAMLAsJSON(v, &req.Inventory.Config); err != nil {
			errs["inventory.config"] = "must be YAML or JSON: a mapping of the plugin's settings"
		}
	}
	if v := vals["options.extra_vars"]; v != "" {
		if err := decodeYAMLAsJSON(v, &req.Options.ExtraVars); err != nil {
			errs["options.extra_vars"] = "must be YAML or JSON: a mapping of variable names to values"
		}
	}
	return req
}

// jobInventory is the request's inventory from the form: the fields of its
// type only (the others stay filled in, hidden, when the type changed).
func jobInventory(vals map[string]string) deployments.JobInventory {
	inv := deployments.JobInventory{Type: cmp.Or(vals["inventory.type"], "inline")}
	switch inv.Type {
	case "git":
		inv.Repository, inv.Ref, inv.Path, inv.Credential = vals["inventory.repository"], vals["inventory.ref"],
			vals["inventory.path"], vals["inventory.credential"]
	case "url":
		inv.URL, inv.Credential = vals["inventory.url"], vals["inventory.credential"]
	case "dynamic":
		inv.Plugin = vals["inventory.plugin"]
	}
	return inv
}

// decodeYAMLAsJSON reads YAML (JSON is YAML) into out as its JSON would
// be read, so that the API's own decoding rules apply.
func decodeYAMLAsJSON(s string, out any) error {
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err // a mapping with keys that are not strings
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(out)
}

func (c *Console) jobSubmit(w http.ResponseWriter, r *http.Request) {
	if !c.mayRunJobs(w, r) {
		return
	}
	names := jobFieldNames()
	vals := map[string]string{}
	for _, n := range names {
		vals[n] = strings.TrimSpace(r.PostFormValue(n))
	}
	errs := map[string]string{}
	req := jobRequest(vals, errs)
	if len(errs) > 0 {
		c.renderJob(w, r, http.StatusUnprocessableEntity, vals, errs, "Correct the fields marked below.", "")
		return
	}
	var j jobView
	res, err := c.call(r, http.MethodPost, "/api/v1/jobs", req, &j)
	if err != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if res.Problem != nil {
		general := problemFields(res.Problem, errs, func(f string) string { return formFieldOf(names, f) })
		c.renderJob(w, r, res.Status, vals, errs, general, "")
		return
	}
	http.Redirect(w, r, Prefix+"/runs/job/"+url.PathEscape(j.ID), http.StatusSeeOther)
}

// problemFields puts the field errors of the API's problem p into errs,
// each by the form field fieldOf names for it (the first error of a field
// only; the API's field named when it is not the form's), and returns the
// rest as a general message: p's own text when no error went anywhere.
func problemFields(p *api.Problem, errs map[string]string, fieldOf func(field string) string) string {
	var general []string
	for _, fe := range p.Errors {
		switch f := fieldOf(fe.Field); {
		case f == "":
			general = append(general, fe.Field+": "+fe.Message)
		case errs[f] != "":
		case fe.Field != f:
			errs[f] = strings.TrimPrefix(fe.Field, f) + ": " + fe.Message
		default:
			errs[f] = fe.Message
		}
	}
	if len(general) == 0 && len(errs) == 0 {
		general = append(general, problemText(p))
	}
	return strings.Join(general, "; ")
}

// formFieldOf is the form field an API error's field belongs to: the
// field itself, or the one it is an element or key of (source.paths[0],
// inventory.hosts.web-1.ansible_host); "" when none.
func formFieldOf(names []string, field string) string {
	best := ""
	for _, n := range names {
		if field == n || (strings.HasPrefix(field, n) && strings.ContainsAny(field[len(n):len(n)+1], "[.")) {
			if len(n) > len(best) {
				best = n
			}
		}
	}
	if best == "" && slices.Contains([]string{"inventory", "inventory.type"}, field) {
		return "inventory.hosts"
	}
	return best
}
