package console_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// surveyCanary is a secret answer: no page may ever hold it.
const surveyCanary = "CANARY-console-survey-7f3a"

// templateJob is a template's job: a playbook on two inline hosts, its
// SSH key by credential name.
func templateJob() map[string]any {
	return map[string]any{
		"source": map[string]any{"type": "playbook", "repository": "https://git.example.com/org/playbooks.git",
			"ref": "v1.0.0", "paths": []string{"site.yml"}},
		"inventory": map[string]any{"type": "inline", "hosts": map[string]any{
			"web-1": map[string]any{"ansible_host": "198.51.100.7"}, "web-2": map[string]any{"ansible_host": "198.51.100.8"}}},
		"credentials": map[string]any{"ssh": "prod-ssh"},
	}
}

// newTemplate stores the credential prod-ssh and a template of the
// project with key: body's fields over templateJob's job.
func newTemplate(t *testing.T, e *deployertest.Env, key string, body map[string]any) templates.Template {
	t.Helper()
	if res, data := e.Do(http.MethodPost, "/api/v1/credentials", key, map[string]any{"project_id": deployertest.Project,
		"name": "prod-ssh", "ref": "vault:secret/projects/" + deployertest.Project + "/ssh#k"}); res.StatusCode != http.StatusCreated &&
		res.StatusCode != http.StatusConflict {
		t.Fatalf("credential: %d %s", res.StatusCode, data)
	}
	b := map[string]any{"project_id": deployertest.Project, "job": templateJob()}
	for k, v := range body {
		b[k] = v
	}
	res, data := e.Do(http.MethodPost, "/api/v1/templates", key, b)
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("template: %d %s", res.StatusCode, data)
	}
	return deployertest.JSON[templates.Template](t, data)
}

// surveyTemplate is a template asking its limit and extra variables on
// launch, with a survey of every question type.
func surveyTemplate() map[string]any {
	return map[string]any{"name": "site", "description": markup,
		"ask_on_launch": map[string]any{"limit": true, "extra_vars": true},
		"survey": []map[string]any{
			{"variable": "release", "label": "Release", "type": "text", "required": true, "max_length": 20},
			{"variable": "replicas", "type": "integer", "min": 1, "max": 5, "default": 2},
			{"variable": "env", "type": "choice", "choices": []string{"staging", "prod"}, "default": "staging"},
			{"variable": "features", "type": "multi_choice", "choices": []string{"a", "b", "c"}},
			{"variable": "db_password", "label": "Database password", "type": "secret", "required": true},
		}}
}

// waitJob waits for job id to end and returns it as the API shows it.
func waitJob(t *testing.T, e *deployertest.Env, key, id string) map[string]any {
	t.Helper()
	var j map[string]any
	testenv.WaitFor(t, 30*time.Second, "job "+id+" to end", func() bool {
		_, body := e.Do(http.MethodGet, "/api/v1/jobs/"+id, key, nil)
		j = deployertest.JSON[map[string]any](t, body)
		return j["finished_at"] != nil
	})
	return j
}

// TestTemplatePagesAndLaunch: the Templates list and a template's page
// (definition, survey, versions, the jobs it launched, markup escaped);
// the launch form asks each survey question by its type, shows the API's
// refusals next to their fields and never puts a secret answer back into
// the page; a launch makes the job of the template's version, and its
// page relaunches it on all or on the failed hosts only. Another
// project's key gets 404 on all of it; each scope shows only its part.
func TestTemplatePagesAndLaunch(t *testing.T) {
	vault := vaulttest.New(t)
	vault.EnableKV("", "secret")
	tok := vault.CreateToken("", vaulttest.TokenSpec{WritePaths: []string{"secret/data/projects/*"}})
	e := deployertest.Start(t, deployertest.Options{Env: map[string]string{"CREDENTIALS_VAULT_ADDR": vault.URL(),
		"CREDENTIALS_VAULT_TOKEN": tok}, JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		if m.CorrelationID == "fail" {
			return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed, FailedHosts: []string{"web-2"}}
		}
		return fakeinfra.Plan{Tasks: 1}
	}})
	key := e.Key("tpl", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeJobsWrite,
		auth.ScopeCredentialsWrite}, deployertest.Project)
	tpl := newTemplate(t, e, key, surveyTemplate())
	// A change makes version 2.
	v2 := surveyTemplate()
	v2["job"], v2["description"] = templateJob(), markup+" v2"
	if res, body := e.Do(http.MethodPut, "/api/v1/templates/"+tpl.ID, key, v2); res.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", res.StatusCode, body)
	}

	b := newBrowser(t, e.URL)
	csrf := b.signIn(key)
	if _, page := b.get("/ui/"); !strings.Contains(page, `href="/ui/templates"`) {
		t.Fatal("no Templates in the navigation of a templates key")
	}
	res, page := b.get("/ui/templates")
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `href="/ui/templates/`+tpl.ID+`">site</a>`) ||
		!regexp.MustCompile(`data-label="Version" class="num">2<`).MatchString(page) ||
		!strings.Contains(page, `href="/ui/templates/`+tpl.ID+`/launch"`) {
		t.Fatalf("templates: %d\n%s", res.StatusCode, page)
	}
	res, page = b.get("/ui/templates/" + tpl.ID)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `href="/ui/templates/`+tpl.ID+`?version=1"`) ||
		!strings.Contains(page, "db_password") || !strings.Contains(page, "multi_choice") || !strings.Contains(page, "limit, extra variables") ||
		!strings.Contains(page, "prod-ssh") || !strings.Contains(page, `id="launch"`) {
		t.Fatalf("template page: %d\n%s", res.StatusCode, page)
	}
	if strings.Contains(page, markup) || !strings.Contains(page, html.EscapeString(markup)) {
		t.Fatalf("the description is not escaped:\n%s", page)
	}
	if _, page := b.get("/ui/templates/" + tpl.ID + "?version=1"); !strings.Contains(page, `id="template-version">1 (the current one is`) {
		t.Errorf("version 1's page:\n%s", page)
	}

	// The form: each question by its type, each input labelled.
	res, page = b.get("/ui/templates/" + tpl.ID + "/launch")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("launch form: %d\n%s", res.StatusCode, page)
	}
	for _, want := range []string{`<input type="password" id="f-survey.db_password"`, `type="number" inputmode="numeric" step="1" id="f-survey.replicas" name="survey.replicas" value="2" min="1" max="5"`,
		`<select id="f-survey.env"`, `<option value="staging" selected>`, `name="survey.features" value="b"`,
		`id="f-limit"`, `id="f-extra_vars"`, `name="version" value="2"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the launch form has no %s", want)
		}
	}
	for _, id := range regexp.MustCompile(`<(?:input|select|textarea)[^>]* id="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		if !strings.Contains(page, `<label for="`+id[1]+`"`) {
			t.Errorf("input %s has no label", id[1])
		}
	}
	form := func(release, replicas string) url.Values {
		return url.Values{"csrf": {csrf}, "version": {"2"}, "survey.release": {release}, "survey.replicas": {replicas},
			"survey.env": {"prod"}, "survey.features": {"a", "c"}, "survey.db_password": {surveyCanary}, "limit": {"web-1"},
			"correlation_id": {"fail"}}
	}
	// The API's refusals, by field; the secret is not in the page.
	res, page = b.post("/ui/templates/"+tpl.ID+"/launch", form(strings.Repeat("r", 21), "9"))
	if res.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(page, `id="e-survey.release"`) ||
		!strings.Contains(page, `id="e-survey.replicas"`) || !strings.Contains(page, `href="#f-survey.release"`) ||
		!strings.Contains(page, `id="secret-note"`) || !strings.Contains(page, `value="9"`) {
		t.Fatalf("refused launch: %d\n%s", res.StatusCode, page)
	}
	if strings.Contains(page, surveyCanary) {
		t.Fatal("a refused launch puts the secret answer back into the page")
	}
	// The form's own: an integer that is not one.
	if res, page := b.post("/ui/templates/"+tpl.ID+"/launch", form("1.4", "three")); res.StatusCode != http.StatusUnprocessableEntity ||
		!strings.Contains(page, `id="e-survey.replicas"`) || strings.Contains(page, surveyCanary) {
		t.Fatalf("launch with a bad integer: %d\n%s", res.StatusCode, page)
	}
	if res, _ := b.post("/ui/templates/"+tpl.ID+"/launch", url.Values{"survey.release": {"1.4"}}); res.StatusCode != http.StatusForbidden {
		t.Fatalf("launch without CSRF: %d, want 403", res.StatusCode)
	}
	if n := len(e.Infra.Jobs()); n != 0 {
		t.Fatalf("%d jobs reached infra from refused launches", n)
	}

	res, _ = b.post("/ui/templates/"+tpl.ID+"/launch", form("1.4", "3"))
	loc := res.Header.Get("Location")
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/runs/job/") {
		t.Fatalf("launch: %d %s", res.StatusCode, loc)
	}
	id := strings.TrimPrefix(strings.SplitN(loc, "?", 2)[0], "/ui/runs/job/")
	j := waitJob(t, e, key, id)
	req, _ := j["request"].(map[string]any)
	ref, _ := req["template"].(map[string]any)
	opts, _ := req["options"].(map[string]any)
	vars, _ := opts["extra_vars"].(map[string]any)
	secretVars, _ := opts["secret_vars"].(map[string]any)
	if ref["id"] != tpl.ID || ref["version"] != float64(2) || vars["release"] != "1.4" || vars["replicas"] != float64(3) ||
		vars["env"] != "prod" || len(vars["features"].([]any)) != 2 || opts["limit"] != "web-1" || secretVars["db_password"] == nil ||
		vars["db_password"] != nil || j["status"] != "failed" {
		t.Fatalf("the launched job: %v", j)
	}

	// Its page names the template, and relaunches it.
	_, page = b.get("/ui/runs/job/" + id)
	if !strings.Contains(page, `id="job-template"`) || !strings.Contains(page, `id="relaunch-all"`) || !strings.Contains(page, `id="relaunch-failed"`) {
		t.Fatalf("the launched job's page:\n%s", page)
	}
	if strings.Contains(page, surveyCanary) {
		t.Fatal("the job's page holds the secret answer")
	}
	if res, _ := b.post("/ui/runs/job/"+id+"/relaunch", url.Values{"hosts": {"failed"}}); res.StatusCode != http.StatusForbidden {
		t.Fatalf("relaunch without CSRF: %d, want 403", res.StatusCode)
	}
	res, _ = b.post("/ui/runs/job/"+id+"/relaunch", url.Values{"csrf": {csrf}, "hosts": {"failed"}})
	loc = res.Header.Get("Location")
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/runs/job/") {
		t.Fatalf("relaunch: %d %s", res.StatusCode, loc)
	}
	again := strings.TrimPrefix(strings.SplitN(loc, "?", 2)[0], "/ui/runs/job/")
	j = waitJob(t, e, key, again)
	req, _ = j["request"].(map[string]any)
	opts, _ = req["options"].(map[string]any)
	if again == id || req["relaunch_of"] != id || opts["limit"] != "web-2" {
		t.Fatalf("relaunched on the failed hosts: %v", j)
	}
	if _, page := b.get("/ui/runs/job/" + again); !strings.Contains(page, `id="relaunch-of"`) {
		t.Errorf("the relaunched job's page does not name the first one:\n%s", page)
	}
	// The template's page lists both.
	if _, page := b.get("/ui/templates/" + tpl.ID); !strings.Contains(page, `href="/ui/runs/job/`+id+`"`) ||
		!strings.Contains(page, `href="/ui/runs/job/`+again+`"`) {
		t.Errorf("the template's recent jobs:\n%s", page)
	}

	// Another project's key: 404 on every page and action of it.
	other := newBrowser(t, e.URL)
	otherCSRF := other.signIn(e.Key("tpl-other", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeJobsWrite},
		deployertest.OtherProject))
	for _, p := range []string{"/ui/templates/" + tpl.ID, "/ui/templates/" + tpl.ID + "?version=1", "/ui/templates/" + tpl.ID + "/launch"} {
		if res, page := other.get(p); res.StatusCode != http.StatusNotFound || strings.Contains(page, "db_password") {
			t.Errorf("another project's key, %s: %d", p, res.StatusCode)
		}
	}
	for _, p := range []string{"/launch", "/schedules", "/triggers"} {
		f := form("1.4", "3")
		f.Set("csrf", otherCSRF)
		f.Set("name", "stolen")
		if res, _ := other.post("/ui/templates/"+tpl.ID+p, f); res.StatusCode != http.StatusNotFound {
			t.Errorf("another project's key, POST %s: %d, want 404", p, res.StatusCode)
		}
	}
	if _, page := other.get("/ui/templates"); strings.Contains(page, tpl.ID) {
		t.Error("another project's template is listed")
	}
	if res, _ := other.post("/ui/runs/job/"+id+"/relaunch", url.Values{"csrf": {otherCSRF}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("another project's key relaunches the job: %d", res.StatusCode)
	}

	// Scopes: templates:read sees, cannot launch; jobs:write alone sees
	// no templates.
	reader := newBrowser(t, e.URL)
	reader.signIn(e.Key("tpl-read", []auth.Scope{auth.ScopeTemplatesRead}, deployertest.Project))
	if res, page := reader.get("/ui/templates/" + tpl.ID); res.StatusCode != http.StatusOK || strings.Contains(page, `id="launch"`) ||
		strings.Contains(page, `id="create-schedule"`) || strings.Contains(page, "/pause") {
		t.Errorf("a reader's template page: %d\n%s", res.StatusCode, page)
	}
	if res, _ := reader.get("/ui/templates/" + tpl.ID + "/launch"); res.StatusCode != http.StatusForbidden {
		t.Errorf("a reader's launch form: %d, want 403", res.StatusCode)
	}
	jobs := newBrowser(t, e.URL)
	jobs.signIn(e.Key("jobs-only", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project))
	if res, page := jobs.get("/ui/templates"); res.StatusCode != http.StatusForbidden || strings.Contains(page, `href="/ui/templates"`) {
		t.Errorf("a jobs key's templates: %d", res.StatusCode)
	}
}

// TestTemplateSchedulesAndTriggers: a template's page makes schedules
// (its next occurrences shown; a refusal next to the form), pauses,
// resumes and deletes them (deleting asks first); it makes triggers and
// rotates their secret, each shown once, the new one valid and the old
// one refused at the hook. Another project's key gets 404 on each.
func TestTemplateSchedulesAndTriggers(t *testing.T) {
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	key := e.Key("tpl", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite},
		deployertest.Project)
	tpl := newTemplate(t, e, key, map[string]any{"name": "nightly", "ask_on_launch": map[string]any{"ref": true}})
	b := newBrowser(t, e.URL)
	csrf := b.signIn(key)
	base := "/ui/templates/" + tpl.ID

	res, page := b.post(base+"/schedules", url.Values{"csrf": {csrf}, "name": {"bad"}, "cron": {"not a cron"}, "timezone": {"UTC"}})
	if res.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(page, `id="schedule-error"`) || !strings.Contains(page, `value="not a cron"`) {
		t.Fatalf("a bad schedule: %d\n%s", res.StatusCode, page)
	}
	res, _ = b.post(base+"/schedules", url.Values{"csrf": {csrf}, "name": {"night"}, "cron": {"0 3 * * *"},
		"timezone": {"Europe/Berlin"}, "missed": {"run_once"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("schedule: %d", res.StatusCode)
	}
	_, body := e.Do(http.MethodGet, "/api/v1/templates/"+tpl.ID+"/schedules", key, nil)
	list := deployertest.JSON[api.ScheduleList](t, body)
	if len(list.Items) != 1 || list.Items[0].Missed != "run_once" || list.Items[0].Timezone != "Europe/Berlin" {
		t.Fatalf("schedules: %s", body)
	}
	sc := list.Items[0]
	_, page = b.get(base)
	if n := strings.Count(page[strings.Index(page, `id="schedule-list"`):], `<li><time`); n < 2 ||
		!strings.Contains(page, `action="/ui/schedules/`+sc.ID+`/pause"`) {
		t.Fatalf("the schedule's next occurrences (%d):\n%s", n, page)
	}
	paused := func(want bool) {
		t.Helper()
		_, body := e.Do(http.MethodGet, "/api/v1/schedules/"+sc.ID, key, nil)
		if got := deployertest.JSON[templates.Schedule](t, body); got.Paused != want {
			t.Fatalf("schedule paused %v, want %v", got.Paused, want)
		}
	}
	if res, _ := b.post("/ui/schedules/"+sc.ID+"/pause", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("pause: %d", res.StatusCode)
	}
	paused(true)
	if _, page := b.get(base); !strings.Contains(page, `action="/ui/schedules/`+sc.ID+`/resume"`) {
		t.Fatalf("a paused schedule offers no resume:\n%s", page)
	}
	if res, _ := b.post("/ui/schedules/"+sc.ID+"/resume", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("resume: %d", res.StatusCode)
	}
	paused(false)

	// Triggers: the secret shown once.
	res, page = b.post(base+"/triggers", url.Values{"csrf": {csrf}, "name": {"push-main"}, "provider": {"github"}, "branches": {"main"}})
	secret := regexp.MustCompile(`<code id="new-secret">([^<]+)</code>`).FindStringSubmatch(page)
	if res.StatusCode != http.StatusCreated || secret == nil || res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("trigger: %d\n%s", res.StatusCode, page)
	}
	_, body = e.Do(http.MethodGet, "/api/v1/templates/"+tpl.ID+"/triggers", key, nil)
	trs := deployertest.JSON[api.TriggerList](t, body)
	if len(trs.Items) != 1 {
		t.Fatalf("triggers: %s", body)
	}
	tr := trs.Items[0]
	_, page = b.get(base)
	if strings.Contains(page, secret[1]) || !strings.Contains(page, e.URL+"/api/v1/hooks/"+tr.ID) {
		t.Fatalf("the template page after the trigger (the secret again, or no URL):\n%s", page)
	}
	if res, page := b.post("/ui/triggers/"+tr.ID+"/rotate", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusOK ||
		!strings.Contains(page, `id="confirm-rotate"`) || strings.Contains(page, `id="new-secret"`) {
		t.Fatalf("rotate without confirmation: %d\n%s", res.StatusCode, page)
	}
	res, page = b.post("/ui/triggers/"+tr.ID+"/rotate", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	rotated := regexp.MustCompile(`<code id="new-secret">([^<]+)</code>`).FindStringSubmatch(page)
	if res.StatusCode != http.StatusOK || rotated == nil || rotated[1] == secret[1] {
		t.Fatalf("rotate: %d\n%s", res.StatusCode, page)
	}
	// GitHub's ping, signed with each secret: the new one only works.
	ping := func(secret, delivery string) int {
		t.Helper()
		payload := []byte(`{"zen":"Keep it logically awesome.","hook_id":` + delivery + `}`)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(payload)
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/api/v1/hooks/"+tr.ID, bytes.NewReader(payload))
		req.Header.Set("X-GitHub-Event", "ping")
		req.Header.Set("X-GitHub-Delivery", "d-"+delivery)
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
		res, err := e.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := ping(secret[1], "1"); got != http.StatusUnauthorized {
		t.Errorf("the old secret after rotation: %d, want 401", got)
	}
	if got := ping(rotated[1], "2"); got != http.StatusOK {
		t.Errorf("the new secret: %d, want 200", got)
	}

	// Another project's key: 404 on each action.
	other := newBrowser(t, e.URL)
	otherCSRF := other.signIn(e.Key("tpl-other", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch},
		deployertest.OtherProject))
	for _, p := range []string{"/ui/schedules/" + sc.ID + "/pause", "/ui/schedules/" + sc.ID + "/delete",
		"/ui/triggers/" + tr.ID + "/rotate", "/ui/triggers/" + tr.ID + "/delete"} {
		if res, page := other.post(p, url.Values{"csrf": {otherCSRF}, "confirm": {"yes"}}); res.StatusCode != http.StatusNotFound ||
			strings.Contains(page, `id="new-secret"`) {
			t.Errorf("another project's key, POST %s: %d, want 404", p, res.StatusCode)
		}
	}
	paused(false)

	// Deleting asks first.
	for _, p := range []string{"/ui/schedules/" + sc.ID + "/delete", "/ui/triggers/" + tr.ID + "/delete"} {
		if res, page := b.post(p, url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-delete"`) {
			t.Fatalf("%s without confirmation: %d\n%s", p, res.StatusCode, page)
		}
		if res, _ := b.post(p, url.Values{"csrf": {csrf}, "confirm": {"yes"}}); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s: %d", p, res.StatusCode)
		}
	}
	_, page = b.get(base)
	if strings.Contains(page, "/ui/schedules/"+sc.ID) || strings.Contains(page, "/ui/triggers/"+tr.ID) {
		t.Fatalf("deleted schedule or trigger still shown:\n%s", page)
	}
}
