package console_test

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

// markup is a user-supplied string that must show as text.
const markup = `<img src=x onerror=alert(1)>`

// jobForm is a valid job form: a playbook on two inline hosts.
func jobForm(csrf, correlation string) url.Values {
	return url.Values{"csrf": {csrf}, "project_id": {deployertest.Project}, "correlation_id": {correlation},
		"source.type": {"playbook"}, "source.repository": {"https://git.example.com/org/playbooks.git"},
		"source.ref": {"v1.4.0"}, "source.paths": {"site.yml, db.yml"},
		"inventory.hosts": {"web-1:\n  ansible_host: 198.51.100.7\ndb-1: {}\n"},
		"options.tags":    {"deploy, web"}, "options.check": {"on"}, "options.verbosity": {"2"},
		"options.extra_vars": {`{"release": "1.4", "replicas": 3}`}}
}

// TestJobsInTheConsole runs Ansible jobs from the console's form (its own
// errors and the API's next to the fields), follows one on its page (the
// API's job stream, resumable), lists jobs with deployments (the
// deployments source lists no job), cancels one, and checks who sees what.
func TestJobsInTheConsole(t *testing.T) {
	release := make(chan struct{})
	e := deployertest.Start(t, deployertest.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		switch m.CorrelationID {
		case "fail":
			return fakeinfra.Plan{Tasks: 2, TaskName: markup, Status: messages.StatusFailed}
		case "hold":
			return fakeinfra.Plan{Hold: release, Tasks: 1}
		}
		return fakeinfra.Plan{Tasks: 2}
	}})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	jobsKey := e.Key("jobs", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project)
	b := newBrowser(t, e.URL)
	csrf := b.signIn(jobsKey)

	// The form is offered to jobs:write only.
	res, page := b.get("/ui/job")
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `href="/ui/job"`) || !strings.Contains(page, `id="f-inventory.hosts"`) {
		t.Fatalf("job form: %d\n%s", res.StatusCode, page)
	}
	// Examples are placeholders, never values typed text would append to;
	// each source type's fields say whose they are (the script shows only
	// the chosen type's).
	if strings.Contains(page, `value="site.yml"`) || !strings.Contains(page, `placeholder="site.yml"`) ||
		!strings.Contains(page, `data-for="collection_role"`) || !strings.Contains(page, `data-for="playbook"`) {
		t.Fatalf("job form fields:\n%s", page)
	}
	ci := newBrowser(t, e.URL)
	ciCSRF := ci.signIn(e.CI)
	if _, page := ci.get("/ui/"); strings.Contains(page, `href="/ui/job"`) {
		t.Fatal("a key without jobs:write is offered the job form")
	}
	if res, _ := ci.get("/ui/job"); res.StatusCode != http.StatusForbidden {
		t.Fatalf("job form for a deployments key: %d, want 403", res.StatusCode)
	}
	if res, _ := ci.post("/ui/job", jobForm(ciCSRF, "")); res.StatusCode != http.StatusForbidden {
		t.Fatalf("job post by a deployments key: %d, want 403", res.StatusCode)
	}

	// The form's own errors: YAML that is not an inventory, a verbosity
	// that is not a number.
	bad := jobForm(csrf, "")
	bad.Set("inventory.hosts", "web-1: [unclosed")
	bad.Set("options.verbosity", "loud")
	res, page = b.post("/ui/job", bad)
	if res.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(page, `id="e-inventory.hosts"`) ||
		!strings.Contains(page, `id="e-options.verbosity"`) || !strings.Contains(page, "web-1: [unclosed") {
		t.Fatalf("form errors: %d\n%s", res.StatusCode, page)
	}
	// The API's: next to their fields, markup in a host name (echoed in
	// the field's path) escaped.
	bad = jobForm(csrf, "")
	bad.Set("source.repository", "")
	bad.Set("inventory.hosts", `["web-1", "`+markup+`"]`)
	bad.Set("credentials.ssh", "no-such-credential")
	res, page = b.post("/ui/job", bad)
	if res.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(page, `id="e-source.repository"`) ||
		!strings.Contains(page, `id="e-inventory.hosts"`) {
		t.Fatalf("API errors: %d\n%s", res.StatusCode, page)
	}
	// A summary first, each error a link to its field.
	if !strings.Contains(page, `id="error-summary"`) || !strings.Contains(page, `href="#f-source.repository"`) ||
		strings.Index(page, `id="error-summary"`) > strings.Index(page, `<form class="stack"`) {
		t.Fatalf("no error summary before the form:\n%s", page)
	}
	if strings.Contains(page, markup) || !strings.Contains(page, html.EscapeString(markup)) {
		t.Fatalf("a host name is not escaped in the form:\n%s", page)
	}
	if n := len(e.Infra.Jobs()); n != 0 {
		t.Fatalf("%d jobs reached infra from invalid forms", n)
	}

	// A valid one goes to its page; its request is the form's.
	res, _ = b.post("/ui/job", jobForm(csrf, "hold"))
	loc := res.Header.Get("Location")
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/runs/job/") {
		t.Fatalf("submit: %d %s", res.StatusCode, loc)
	}
	held := strings.TrimPrefix(loc, "/ui/runs/job/")
	testenv.WaitFor(t, 20*time.Second, "the job reaches infra", func() bool { return len(e.Infra.Jobs()) == 1 })
	m := e.Infra.Jobs()[0]
	if m.JobID != held || m.Source.Ref != "v1.4.0" || strings.Join(m.Source.Paths, ",") != "site.yml,db.yml" ||
		len(m.Inventory.Hosts) != 2 || m.Inventory.Hosts["web-1"]["ansible_host"] != "198.51.100.7" ||
		!m.Options.Check || m.Options.Verbosity != 2 || strings.Join(m.Options.Tags, ",") != "deploy,web" ||
		m.Options.ExtraVars["release"] != "1.4" {
		t.Fatalf("the job's request is not the form's: %+v", m)
	}
	res, page = b.get(loc)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="live-output"`) ||
		!strings.Contains(page, `data-events="/ui/runs/job/`+held+`/stream"`) || !strings.Contains(page, `id="cancel"`) {
		t.Fatalf("running job's page: %d\n%s", res.StatusCode, page)
	}

	// A job with markup in its task names fails: its page shows them as
	// text, with its recap, playbooks, commit and log.
	res, _ = b.post("/ui/job", jobForm(csrf, "fail"))
	failed := strings.TrimPrefix(res.Header.Get("Location"), "/ui/runs/job/")
	if _, body := e.Do(http.MethodGet, "/api/v1/jobs/"+failed+"?wait=30s", jobsKey, nil); !strings.Contains(string(body), `"status":"failed"`) {
		t.Fatalf("the failing job: %s", body)
	}
	res, page = b.get("/ui/runs/job/" + failed)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("failed job's page: %d\n%s", res.StatusCode, page)
	}
	for _, want := range []string{`id="full-log"`, `id="failed-task"`, `id="playbooks"`, strings.Repeat("ab", 20),
		html.EscapeString(markup) + " 1", `<td data-label="Host" class="mono">db-1</td>`, "changed 2"} {
		if !strings.Contains(page, want) {
			t.Fatalf("failed job's page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, markup) {
		t.Fatalf("a task name is not escaped in the job page:\n%s", page)
	}

	// Its stream through the console resumes after Last-Event-ID.
	events := func(last string) (int, string) { return b.events("/ui/runs/job/"+failed+"/stream", last) }
	status, all := events("")
	ids := regexp.MustCompile(`(?m)^id: (\S+)$`).FindAllStringSubmatch(all, -1)
	if status != http.StatusOK || !strings.Contains(all, "event: task_started") || !strings.Contains(all, "event: run_finished") || len(ids) < 3 {
		t.Fatalf("job stream: %d\n%s", status, all)
	}
	if status, rest := events(ids[0][1]); status != http.StatusOK || strings.Contains(rest, "id: "+ids[0][1]+"\n") ||
		!strings.Contains(rest, "id: "+ids[1][1]+"\n") {
		t.Fatalf("resume after %s: %d\n%s", ids[0][1], status, rest)
	}
	if res, body := b.get("/ui/runs/job/" + failed + "/logs"); res.StatusCode != http.StatusOK || !strings.Contains(body, "TASK [") {
		t.Fatalf("job log: %d %s", res.StatusCode, body)
	}

	// The runs list: jobs with the deployments; the deployments' kind
	// lists no job; filters and the cursor keep working across kinds.
	if res, body := e.Do(http.MethodPost, "/api/v1/deployments?wait=30s", e.CI, deployertest.Request()); res.StatusCode != http.StatusOK {
		t.Fatalf("deploy: %d %s", res.StatusCode, body)
	}
	admin := newBrowser(t, e.URL)
	admin.signIn(e.Admin)
	_, page = admin.get("/ui/runs")
	for _, want := range []string{"/ui/runs/job/" + held, "/ui/runs/job/" + failed, "/ui/runs/deployment/", "db-1, web-1",
		"https://git.example.com/org/playbooks.git@v1.4.0 site.yml, db.yml"} {
		if !strings.Contains(page, want) {
			t.Fatalf("runs list lacks %q:\n%s", want, page)
		}
	}
	if _, page := admin.get("/ui/runs?kind=deployment"); strings.Contains(page, "/ui/runs/job/") {
		t.Fatal("the deployments' kind lists jobs")
	}
	if _, page := admin.get("/ui/runs?kind=job&status=failed"); !strings.Contains(page, failed) || strings.Contains(page, held) {
		t.Fatalf("kind=job&status=failed:\n%s", page)
	}
	if _, page := admin.get("/ui/runs?server=198.51.100.7"); strings.Contains(page, "/ui/runs/job/") {
		t.Fatal("a server filter lists jobs")
	}
	seen := map[string]bool{}
	path := "/ui/runs?limit=1"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("the pages never end")
		}
		_, page := admin.get(path)
		for _, m := range regexp.MustCompile(`/ui/runs/(deployment|job)/([0-9a-f-]{36})"`).FindAllStringSubmatch(page, -1) {
			if seen[m[2]] {
				t.Fatalf("%s listed twice", m[2])
			}
			seen[m[2]] = true
		}
		path = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next-page"`).FindStringSubmatch(page); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 3 {
		t.Fatalf("paged through %d runs one by one, want 3 (2 jobs, 1 deployment)", len(seen))
	}

	// The overview's runs per hour count jobs for keys that may read them
	// only: 2 jobs and 1 deployment for the admin, the deployment for the
	// deployments key, the jobs for the jobs key.
	for _, c := range []struct {
		b    *browser
		want string
	}{{admin, "(3 runs)"}, {ci, "(1 runs)"}, {b, "(2 runs)"}} {
		if _, page := c.b.get("/ui/"); !strings.Contains(page, c.want) {
			t.Fatalf("overview, want %s:\n%s", c.want, page)
		}
	}

	// Who sees a job: a deployments key neither lists nor opens it (404,
	// as the API answers), nor does another project's jobs key.
	if _, page := ci.get("/ui/runs"); strings.Contains(page, "/ui/runs/job/") {
		t.Fatal("a deployments key lists jobs")
	}
	for _, p := range []string{"/ui/runs/job/" + failed, "/ui/runs/deployment/" + failed, "/ui/runs/job/" + failed + "/stream"} {
		if res, _ := ci.get(p); res.StatusCode != http.StatusNotFound {
			t.Fatalf("deployments key %s: %d, want 404", p, res.StatusCode)
		}
	}
	other := newBrowser(t, e.URL)
	other.signIn(e.Key("other-jobs", []auth.Scope{auth.ScopeJobsWrite}, "22222222-3333-4444-5555-666666666666"))
	if res, _ := other.get("/ui/runs/job/" + failed); res.StatusCode != http.StatusNotFound {
		t.Fatalf("another project's job: %d, want 404", res.StatusCode)
	}
	if _, page := other.get("/ui/runs"); strings.Contains(page, failed) {
		t.Fatal("another project's job is listed")
	}
	// A job's id on the deployments' page goes to the job's page.
	if res, _ := b.get("/ui/runs/deployment/" + failed); res.StatusCode != http.StatusSeeOther ||
		res.Header.Get("Location") != "/ui/runs/job/"+failed {
		t.Fatalf("a job's id on the deployment page: %d %s", res.StatusCode, res.Header.Get("Location"))
	}

	// Cancel the held job from its page.
	if res, _ := other.post("/ui/runs/job/"+held+"/cancel", url.Values{"csrf": {csrfOf(t, func() string { _, p := other.get("/ui/"); return p }())}}); res.StatusCode != http.StatusNotFound {
		t.Fatalf("another project's key cancels: %d, want 404", res.StatusCode)
	}
	res, _ = b.post("/ui/runs/job/"+held+"/cancel", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther || !strings.Contains(res.Header.Get("Location"), "done=cancel") {
		t.Fatalf("cancel: %d %s", res.StatusCode, res.Header.Get("Location"))
	}
	testenv.WaitFor(t, 20*time.Second, "the job is cancelled", func() bool {
		_, page := b.get("/ui/runs/job/" + held)
		return strings.Contains(page, `id="run-status">cancelled<`)
	})
}

// TestJobRunAgain: a finished job's page offers Run again, the form
// filled in with its request, which, sent as it is, makes a new job with
// the same request; another project's key cannot fill it from that job.
func TestJobRunAgain(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{JobPlanFor: func(m *messages.AnsibleJobMessage) fakeinfra.Plan {
		return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed}
	}})
	jobsKey := e.Key("jobs", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project)
	b := newBrowser(t, e.URL)
	csrf := b.signIn(jobsKey)
	res, _ := b.post("/ui/job", jobForm(csrf, "first"))
	failed := strings.TrimPrefix(res.Header.Get("Location"), "/ui/runs/job/")
	if _, body := e.Do(http.MethodGet, "/api/v1/jobs/"+failed+"?wait=30s", jobsKey, nil); !strings.Contains(string(body), `"status":"failed"`) {
		t.Fatalf("the first job: %s", body)
	}
	_, page := b.get("/ui/runs/job/" + failed)
	// Run again: the form filled in with its request, which, sent as it
	// is, makes a new job with the same request.
	if !strings.Contains(page, `href="/ui/job?from=`+failed+`" id="run-again"`) {
		t.Fatalf("a finished job's page offers no Run again:\n%s", page)
	}
	res, page = b.get("/ui/job?from=" + failed)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="job-note"`) {
		t.Fatalf("run again: %d\n%s", res.StatusCode, page)
	}
	again := formValues(t, page)
	for name, want := range map[string]string{"source.repository": "https://git.example.com/org/playbooks.git",
		"source.ref": "v1.4.0", "source.paths": "site.yml, db.yml", "options.tags": "deploy, web", "options.check": "on",
		"options.verbosity": "2", "correlation_id": ""} {
		if got := again.Get(name); got != want {
			t.Errorf("run again: %s is %q, want %q", name, got, want)
		}
	}
	jobsBefore := len(e.Infra.Jobs())
	res, _ = b.post("/ui/job", again)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("run again, submitted: %d", res.StatusCode)
	}
	testenv.WaitFor(t, 20*time.Second, "the job run again reaches infra", func() bool { return len(e.Infra.Jobs()) == jobsBefore+1 })
	ran := e.Infra.Jobs()[jobsBefore]
	if ran.JobID == failed || ran.Source.Ref != "v1.4.0" || strings.Join(ran.Source.Paths, ",") != "site.yml,db.yml" ||
		len(ran.Inventory.Hosts) != 2 || ran.Inventory.Hosts["web-1"]["ansible_host"] != "198.51.100.7" ||
		!ran.Options.Check || ran.Options.Verbosity != 2 || strings.Join(ran.Options.Tags, ",") != "deploy,web" ||
		ran.Options.ExtraVars["release"] != "1.4" {
		t.Fatalf("the job run again is not the first one's request: %+v", ran)
	}
	// Another project's key cannot fill the form from this job.
	stranger := newBrowser(t, e.URL)
	stranger.signIn(e.Key("jobs-other", []auth.Scope{auth.ScopeJobsWrite}, "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"))
	if res, page := stranger.get("/ui/job?from=" + failed); res.StatusCode != http.StatusNotFound || strings.Contains(page, "playbooks.git") {
		t.Errorf("another project's key runs this job again: %d\n%s", res.StatusCode, page)
	}
}

var (
	inputRE    = regexp.MustCompile(`<input id="f-[^"]*" name="([^"]+)" value="([^"]*)"`)
	checkRE    = regexp.MustCompile(`<input type="checkbox" id="f-[^"]*" name="([^"]+)" checked`)
	textareaRE = regexp.MustCompile(`(?s)<textarea id="f-[^"]*" name="([^"]+)"[^>]*>(.*?)</textarea>`)
	selectRE   = regexp.MustCompile(`(?s)<select id="f-[^"]*" name="([^"]+)".*?<option value="([^"]*)" selected>`)
)

// formValues reads the job form's values from its page, as a browser
// would send them (with the page's CSRF token).
func formValues(t *testing.T, page string) url.Values {
	t.Helper()
	v := url.Values{"csrf": {csrfOf(t, page)}}
	for _, m := range inputRE.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	for _, m := range checkRE.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], "on")
	}
	for _, m := range textareaRE.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	for _, m := range selectRE.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], m[2])
	}
	return v
}

// TestJobFormProjectPicker: a key of several projects picks the job's
// project from them; a key of one gets it filled in.
func TestJobFormProjectPicker(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{})
	const second = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"
	b := newBrowser(t, e.URL)
	csrf := b.signIn(e.Key("two", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project, second))
	_, page := b.get("/ui/job")
	if !strings.Contains(page, `<select id="f-project_id" name="project_id"`) || !strings.Contains(page, `<option value="`+second+`"`) {
		t.Fatalf("a key of two projects gets no project picker:\n%s", page)
	}
	pick := deployertest.Project // the one the picker does not start at
	switch start := formValues(t, page).Get("project_id"); start {
	case deployertest.Project:
		pick = second
	case second:
	default:
		t.Fatalf("the picker starts at %q, not at one of the key's projects", start)
	}
	form := jobForm(csrf, "")
	form.Set("project_id", pick)
	res, _ := b.post("/ui/job", form)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("submit for the picked project: %d", res.StatusCode)
	}
	testenv.WaitFor(t, 20*time.Second, "the job reaches infra", func() bool { return len(e.Infra.Jobs()) == 1 })
	if got := e.Infra.Jobs()[0].ProjectID; got != pick {
		t.Errorf("the job's project is %q, want the picked %s", got, pick)
	}

	one := newBrowser(t, e.URL)
	one.signIn(e.Key("one", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project))
	if _, page := one.get("/ui/job"); strings.Contains(page, `<select id="f-project_id"`) || !strings.Contains(page, `value="`+deployertest.Project+`"`) {
		t.Errorf("a key of one project: no filled-in project field:\n%s", page)
	}
}

// TestJobPageShowsItsPlaceInLine: a queued job waiting for a busy host
// says so on its page, with its place in the host's line.
func TestJobPageShowsItsPlaceInLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	// A live replica of the default pool (its consumer just read the queue).
	if err := e.Redis.XGroupCreateMkStream(ctx, e.Streams.JobQueue, "infra", "$").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.Redis.XGroupCreateConsumer(ctx, e.Streams.JobQueue, "infra", "infra-1").Err(); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, e.URL)
	csrf := b.signIn(e.Key("line", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project))
	res, _ := b.post("/ui/job", jobForm(csrf, ""))
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("submit: %d", res.StatusCode)
	}
	page := res.Header.Get("Location")
	id := page[strings.LastIndex(page, "/")+1:]
	holder, err := store.NewLocker(e.DB, 0).Acquire(ctx, "running-"+id, "server:busy-1", store.LockOptions{NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	for _, job := range []string{"first-" + id, id} {
		if _, err := store.JoinLines(ctx, e.DB, store.Waiter{Job: job}, []string{"server:busy-1"}); err != nil {
			t.Fatal(err)
		}
	}
	_, html := b.get(page)
	if !strings.Contains(html, `id="job-waiting"`) || !strings.Contains(html, "server:busy-1 (busy, 1 ahead)") || !strings.Contains(html, "(position 2)") {
		t.Errorf("the page of a job waiting for a busy host:\n%s", html)
	}
}

// TestJobFormInventoriesAndOptions: the form runs jobs on a git, a URL and
// a dynamic inventory (only the chosen type's fields are sent), with forks,
// and Run again fills those fields back in.
func TestJobFormInventoriesAndOptions(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{})
	b := newBrowser(t, e.URL)
	csrf := b.signIn(e.Key("inventories", []auth.Scope{auth.ScopeJobsWrite}, deployertest.Project))
	tests := []struct {
		name   string
		fields map[string]string
		check  func(inv deployments.JobInventory) bool
	}{
		{"git", map[string]string{"inventory.type": "git", "inventory.repository": "https://git.example.com/org/inventory.git",
			"inventory.ref": "main", "inventory.path": "prod/hosts.yml", "inventory.credential": "vault:secret/projects/" + deployertest.Project + "/inventory-token"},
			func(inv deployments.JobInventory) bool {
				return inv.Repository == "https://git.example.com/org/inventory.git" && inv.Ref == "main" &&
					inv.Path == "prod/hosts.yml" && inv.Credential == "vault:secret/projects/"+deployertest.Project+"/inventory-token" && len(inv.Hosts) == 0
			}},
		{"url", map[string]string{"inventory.type": "url", "inventory.url": "https://cmdb.example.com/inventory.yml"},
			func(inv deployments.JobInventory) bool {
				return inv.URL == "https://cmdb.example.com/inventory.yml" && inv.Repository == "" && len(inv.Hosts) == 0
			}},
		{"dynamic", map[string]string{"inventory.type": "dynamic", "inventory.plugin": "amazon.aws.aws_ec2",
			"inventory.config": "regions:\n    - eu-west-1\n"},
			func(inv deployments.JobInventory) bool {
				regions, _ := inv.Config["regions"].([]any)
				return inv.Plugin == "amazon.aws.aws_ec2" && len(regions) == 1 && regions[0] == "eu-west-1"
			}},
	}
	for _, tt := range tests {
		form := jobForm(csrf, "inventory-"+tt.name)
		form.Set("options.forks", "7")
		for k, v := range tt.fields {
			form.Set(k, v)
		}
		res, page := b.post("/ui/job", form)
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s inventory: %d\n%s", tt.name, res.StatusCode, page)
		}
		id := strings.TrimPrefix(res.Header.Get("Location"), "/ui/runs/job/")
		var ran *messages.AnsibleJobMessage
		testenv.WaitFor(t, 20*time.Second, "the job reaches infra", func() bool {
			for _, m := range e.Infra.Jobs() {
				if m.JobID == id {
					ran = m
				}
			}
			return ran != nil
		})
		var j struct {
			Request deployments.JobRequest `json:"request"`
		}
		_, body := e.Do(http.MethodGet, "/api/v1/jobs/"+id, e.Key("reader-"+tt.name, []auth.Scope{auth.ScopeJobsRead}, deployertest.Project), nil)
		if err := json.Unmarshal(body, &j); err != nil {
			t.Fatal(err)
		}
		if inv := j.Request.Inventory; inv.Type != tt.name || !tt.check(inv) || j.Request.Options.Forks != 7 {
			t.Errorf("%s inventory: the job's request is %+v with forks %d", tt.name, inv, j.Request.Options.Forks)
		}
		if ran.Options.Forks != 7 {
			t.Errorf("%s inventory: infra got forks %d", tt.name, ran.Options.Forks)
		}
		_, page = b.get("/ui/job?from=" + id)
		again := formValues(t, page)
		for k, want := range tt.fields {
			if got := strings.TrimSpace(again.Get(k)); got != strings.TrimSpace(want) {
				t.Errorf("%s inventory, run again: %s is %q, want %q", tt.name, k, got, want)
			}
		}
		if again.Get("options.forks") != "7" || strings.Contains(page, "cannot hold") {
			t.Errorf("%s inventory, run again: forks %q, or a note that the form cannot hold it:\n%s", tt.name, again.Get("options.forks"), page)
		}
	}
}
