package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

// xss is a user-supplied string that must show as text everywhere.
const xss = `<img src=x onerror=alert(1)>`

// watcher records what goes wrong in the page: JavaScript console errors,
// uncaught exceptions, browser log errors (CSP violations among them),
// failed requests, responses >= 400 not expected, dialogs.
type watcher struct {
	mu       sync.Mutex
	urls     map[network.RequestID]string
	problems []string
	dialogs  []string
	expect   map[int]bool // statuses the current step expects
}

func (w *watcher) listen(ev any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		w.urls[e.RequestID] = e.Request.URL
	case *network.EventLoadingFailed:
		if !e.Canceled { // a navigation away ends an event stream
			w.problems = append(w.problems, "request failed: "+w.urls[e.RequestID]+": "+e.ErrorText)
		}
	case *network.EventResponseReceived:
		if e.Response.Status >= 400 && !w.expect[int(e.Response.Status)] {
			w.problems = append(w.problems, fmt.Sprintf("HTTP %d: %s", int(e.Response.Status), e.Response.URL))
		}
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
			w.problems = append(w.problems, "console."+string(e.Type)+" called")
		}
	case *runtime.EventExceptionThrown:
		w.problems = append(w.problems, "exception: "+e.ExceptionDetails.Text)
	case *cdplog.EventEntryAdded:
		if e.Entry.Level == cdplog.EntryLevelError && !w.expect[statusOf(e.Entry.Text)] {
			w.problems = append(w.problems, "browser log: "+e.Entry.Text)
		}
	case *page.EventJavascriptDialogOpening:
		w.dialogs = append(w.dialogs, e.Message)
	}
}

// statusOf reads the status of Chromium's "Failed to load resource: the
// server responded with a status of 403 (Forbidden)".
func statusOf(text string) int {
	_, rest, ok := strings.Cut(text, "status of ")
	if !ok || len(rest) < 3 {
		return 0
	}
	n, _ := strconv.Atoi(rest[:3])
	return n
}

// check fails the test with what went wrong since the last check.
func (w *watcher) check(t *testing.T, step string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.problems) > 0 {
		t.Errorf("%s: the page had problems:\n  %s", step, strings.Join(w.problems, "\n  "))
	}
	if len(w.dialogs) > 0 {
		t.Errorf("%s: dialogs opened (a script ran?): %q", step, w.dialogs)
	}
	w.problems, w.dialogs, w.expect = nil, nil, nil
}

func (w *watcher) expecting(statuses ...int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expect = map[int]bool{}
	for _, s := range statuses {
		w.expect[s] = true
	}
}

// chromium returns the browser to drive: Debian's chromium, which the
// test setup installs (scripts/services.sh). It fails, never skips, when
// it is missing.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: the console's browser tests need Debian's chromium (apt-get install -y chromium; scripts/services.sh installs it)")
	return ""
}

// artifacts is where screenshots go: $TEST_ARTIFACTS/console when set, else
// the test's temporary directory.
func artifacts(t *testing.T) string {
	dir := t.TempDir()
	if base := os.Getenv("TEST_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, "console")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("console screenshots in %s", dir)
	return dir
}

// TestConsoleInBrowser drives the web console of the real deployer binary
// in headless Chromium, against real Redis and Postgres and the stand-in
// infra (fakeinfra) for deployments.
// axeCore returns axe-core's browser build, from AXE_CORE_JS (make test
// installs it from npm: scripts/lib.sh, ensure_axe_core).
func axeCore(t *testing.T) string {
	t.Helper()
	path := os.Getenv("AXE_CORE_JS")
	if path == "" {
		t.Fatal("AXE_CORE_JS is not set: the console's accessibility checks need axe-core from npm (make test installs it: scripts/lib.sh, ensure_axe_core)")
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("axe-core: %v", err)
	}
	return string(src)
}

// axeViolations runs axe-core over the page (injected through DevTools,
// which the page's CSP does not govern) and returns its violations as
// JSON: rule, impact, help and the first nodes of each; "[]" when none.
func axeViolations(ctx context.Context, axe string) (string, error) {
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](axe+";true")); err != nil {
		return "", fmt.Errorf("inject axe-core: %w", err)
	}
	return chromedp.Run(ctx, chromedp.Evaluate[string](`axe.run(document, {resultTypes: ["violations"]}).then(r =>
		JSON.stringify(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
			nodes: v.nodes.slice(0, 3).map(n => n.target.join(" ") + ": " + n.failureSummary)})), null, 1))`, chromedp.EvalAwaitPromise))
}

func TestConsoleInBrowser(t *testing.T) {
	bin := testenv.BuildBinary(t, ".") // skips under -short, before chromium is required
	exe := chromium(t)
	dsn := testenv.Postgres(t)
	redisURL := testenv.RedisDB(t)
	port := testenv.FreePort(t)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	env := testenv.BinaryEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL, "API_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"ADMIN_ADDR=127.0.0.1:0", "API_KEY_CACHE_TTL=0s", "LOG_FORMAT=json",
		"WEBHOOK_SIGNING_KEY=browser-test-webhook-signing-key-0123456789")
	stdout, stderr, code := testenv.RunBinary(t, bin, env, "keys", "create", "--name", "operator", "--scopes", "admin")
	if code != 0 {
		t.Fatalf("keys create: %d %s", code, stderr)
	}
	key := ""
	for f := range strings.FieldsSeq(stdout) {
		if strings.HasPrefix(f, "apk_") {
			key = f
		}
	}
	if key == "" {
		t.Fatalf("no key in %q", stdout)
	}
	proc := testenv.StartBinary(t, bin, env)
	proc.WaitHTTP(base+"/ui/signin", 200, 30*time.Second)

	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	ropt, _ := redis.ParseURL(redisURL)
	rdb := redis.NewClient(ropt)
	t.Cleanup(func() { _ = rdb.Close() })
	seedConsole(t, ctx, db, rdb)

	// The stand-in infra: a deployment with correlation id "live" waits
	// for release, one with "hold" until it is cancelled.
	release, hold, releaseJob := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var jobRuns atomic.Int32
	infra := &fakeinfra.Infra{DB: db, Redis: rdb, Queue: messages.StreamAnsibleDeployQueue, Results: messages.StreamDeployResults,
		Logs: runlog.NewPostgres(db, 1<<20), PlanFor: func(m *messages.AnsibleDeployMessage) fakeinfra.Plan {
			switch m.CorrelationID {
			case "live":
				// The message as a play colours it: ANSI codes around markup.
				return fakeinfra.Plan{Tasks: 3, TaskDelay: 300 * time.Millisecond, Hold: release, EventMessage: "\x1b[0;33m" + xss + "\x1b[0m"}
			case "hold":
				return fakeinfra.Plan{Hold: hold}
			case "unreachable":
				return fakeinfra.Plan{Status: messages.StatusUnreachable, Kind: messages.KindSSHUnreachable}
			}
			return fakeinfra.Plan{Tasks: 1}
		},
		// An Ansible job waits for releaseJob; its task names hold markup.
		JobQueue: messages.StreamAnsibleJobQueue, JobResults: messages.StreamJobResults,
		// The first waits for releaseJob; the next (run again) fails.
		JobPlanFor: func(*messages.AnsibleJobMessage) fakeinfra.Plan {
			if jobRuns.Add(1) > 1 {
				return fakeinfra.Plan{Tasks: 1, Status: messages.StatusFailed, TaskName: "fails"}
			}
			return fakeinfra.Plan{Tasks: 2, TaskDelay: 300 * time.Millisecond, Hold: releaseJob, TaskName: xss}
		}}
	infraDone := make(chan struct{})
	go func() { defer close(infraDone); _ = infra.Run(ctx) }()
	t.Cleanup(func() { stop(); <-infraDone })

	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.Flag("headless", "new"), chromedp.NoSandbox, chromedp.DisableGPU,
		// Without /dev/shm its shared memory files go to the temp dir: the
		// test's own, so that none is left behind when Chromium is killed.
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Env("TMPDIR="+t.TempDir()))...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	w := &watcher{urls: map[network.RequestID]string{}}
	if err := chromedp.Listen(bctx, w.listen); err != nil {
		t.Fatal(err)
	}
	shots := artifacts(t)
	run := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 15*time.Second)
		defer cancel()
		s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	location := func() string {
		t.Helper()
		loc, err := chromedp.Run(bctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimPrefix(loc, base)
	}
	axe := axeCore(t)
	// screenshot saves the page at a laptop's and a phone's width, and
	// checks it at each with axe-core: any violation fails the test.
	screenshot := func(name string) {
		t.Helper()
		for _, size := range []struct {
			label string
			w, h  int64
		}{{"laptop", 1366, 768}, {"phone", 390, 844}} {
			sctx, cancel := context.WithTimeout(bctx, 30*time.Second)
			err := chromedp.Do(sctx, chromedp.EmulateViewport(size.w, size.h))
			var png []byte
			if err == nil {
				png, err = chromedp.Run(sctx, chromedp.CaptureScreenshot())
			}
			var violations string
			if err == nil {
				violations, err = axeViolations(sctx, axe)
			}
			// Nothing wider than the screen: the page does not scroll
			// sideways.
			var wide int
			if err == nil {
				wide, err = chromedp.Run(sctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
			}
			cancel()
			if err != nil {
				t.Fatalf("screenshot %s: %v", name, err)
			}
			if violations != "[]" {
				t.Errorf("%s at the %s's size: accessibility violations (axe-core):\n%s", name, size.label, violations)
			}
			if wide > 0 {
				t.Errorf("%s at the %s's size: the page is %d px wider than the screen", name, size.label, wide)
			}
			if err := os.WriteFile(filepath.Join(shots, name+"-"+size.label+".png"), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		run("viewport", chromedp.EmulateViewport(1366, 768))
	}
	// waitFor polls a JavaScript condition (after reloads when reload).
	waitFor := func(step, js string, reload bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok, err := chromedp.Run(bctx, chromedp.Evaluate[bool](js))
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s never held (%v)", step, js, err)
			}
			time.Sleep(200 * time.Millisecond)
			if reload {
				run(step, chromedp.Reload())
			}
		}
	}

	// A page without a session goes to the sign-in page.
	run("fleet without a session", chromedp.Navigate(base+"/ui/fleet"), chromedp.WaitVisible(chromedp.CSS("#key")))
	if loc := location(); !strings.HasPrefix(loc, "/ui/signin?next=") {
		t.Fatalf("without a session: at %s, want the sign-in page", loc)
	}
	screenshot("signin")
	w.check(t, "sign-in page")

	// A wrong key is refused.
	w.expecting(401)
	run("wrong key", chromedp.SetValue(chromedp.CSS("#key"), "apk_"+strings.Repeat("b", 52)),
		chromedp.Click(chromedp.CSS("#signin")), chromedp.WaitVisible(chromedp.CSS("#signin-error")))
	if msg := text("#signin-error"); !strings.Contains(msg, "not valid") {
		t.Fatalf("wrong key: %q", msg)
	}
	w.check(t, "wrong key")

	// The right key signs in, and lands on the page first asked for.
	run("sign in", chromedp.SetValue(chromedp.CSS("#key"), key), chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#servers")))
	if loc := location(); loc != "/ui/fleet" {
		t.Fatalf("after sign-in at %s", loc)
	}
	// The server whose name (label) and last error hold markup shows it as
	// text: no element was made of it, no script ran.
	if got := text("#servers"); !strings.Contains(got, xss) {
		t.Fatalf("the fleet does not show the label as text:\n%s", got)
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); err != nil || n != 0 {
		t.Fatalf("the page holds %d img elements (%v): markup was not escaped", n, err)
	}
	screenshot("fleet")
	w.check(t, "fleet")

	// Filters.
	run("filter", chromedp.Navigate(base+"/ui/fleet?status=READY"), chromedp.WaitVisible(chromedp.CSS("#servers")))
	if got := text("#servers"); !strings.Contains(got, "web-1") || strings.Contains(got, "evil-1") {
		t.Fatalf("status filter:\n%s", got)
	}
	w.check(t, "fleet filter")

	// One server, with the markup in its last error and labels as text.
	run("server", chromedp.Navigate(base+"/ui/fleet/evil-1"), chromedp.WaitVisible(chromedp.CSS("#server-handle")))
	if got := text("main"); !strings.Contains(got, xss) || !strings.Contains(got, "SHA256:") {
		t.Fatalf("server page:\n%s", got)
	}
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); n != 0 {
		t.Fatal("the server page made an img element of a label")
	}
	screenshot("server")
	w.check(t, "server")

	// Provision it: the API's operation records the request; the
	// scheduler and infra are played by the test (store.StartRun, as infra
	// does); the run appears in the runs list.
	run("provision", chromedp.Click(chromedp.CSS("#op-provision")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	var requested string
	if err := db.QueryRow(ctx, `SELECT COALESCE(requested_action, '') FROM servers WHERE handle = 'evil-1'`).Scan(&requested); err != nil || requested != "provision" {
		t.Fatalf("provision not requested: %q %v", requested, err)
	}
	// The runs page, refreshing itself, shows the run once infra starts it.
	run("runs", chromedp.Navigate(base+"/ui/runs?kind=provision"), chromedp.WaitVisible(chromedp.CSS("#runs")),
		chromedp.Click(chromedp.CSS("#refresh-toggle")))
	waitFor("the runs page refreshes itself", `location.search.includes("refresh=1") && !!document.querySelector('meta[http-equiv="refresh"]')`, false)
	jobID := "prov-" + testenv.Unique("")
	if _, _, err := store.StartRun(ctx, db, store.RunStart{JobID: jobID, Kind: "provision", Stream: messages.StreamProvisionerQueue,
		RequestID: "1-1", Target: "evil-1", ServerHandle: "evil-1", Playbook: "setup_server.yml", Owner: "test"}); err != nil {
		t.Fatal(err)
	}
	waitFor("provisioning run appears", `document.querySelector("#runs").textContent.includes("`+jobID+`")`, false)
	res := &messages.ProvisionerResult{Outcome: messages.Outcome{JobID: jobID, RequestID: "1-1", Status: messages.StatusFailed,
		Error: &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "verify_server.yml failed"}, FailedTask: &messages.FailedTask{Name: xss, Host: "evil-1", Message: "boom"},
		Hosts: map[string]messages.HostRecap{"evil-1": {Ok: 17, Changed: 4, Failed: 1, Skipped: 3}}},
		Playbooks: []messages.PlaybookOutcome{{Playbook: "setup_server.yml", Status: "succeeded"}, {Playbook: "verify_server.yml", Status: "failed", ErrorKind: "playbook_failed"}}}
	enc, err := messages.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := messages.DecodeProvisionerResult(enc); err != nil {
		t.Fatalf("the test's result is not one infra could write: %v", err)
	}
	if err := store.FinishRun(ctx, db, jobID, 1, "failed", "playbook_failed", enc); err != nil {
		t.Fatal(err)
	}
	run("provisioning run", chromedp.Navigate(base+"/ui/runs/provision/"+jobID), chromedp.WaitVisible(chromedp.CSS("#playbooks")))
	if got := text("main"); !strings.Contains(got, "verify_server.yml") || !strings.Contains(got, xss) {
		t.Fatalf("provisioning run page:\n%s", got)
	}
	// Its recap per host (the page answered 500 once for reading it).
	if got := strings.Fields(text("table.recap tbody")); !slices.Equal(got, []string{"evil-1", "17", "4", "1", "0", "3"}) {
		t.Fatalf("provisioning run's recap: %q", got)
	}
	screenshot("provision-run")
	w.check(t, "provisioning run")
	// A later run that succeeds, with its recap.
	okID := "prov-" + testenv.Unique("")
	if _, _, err := store.StartRun(ctx, db, store.RunStart{JobID: okID, Kind: "provision", Stream: messages.StreamProvisionerQueue,
		RequestID: "1-2", Target: "evil-1", ServerHandle: "evil-1", Playbook: "setup_server.yml", Owner: "test"}); err != nil {
		t.Fatal(err)
	}
	ok := &messages.ProvisionerResult{Outcome: messages.Outcome{JobID: okID, RequestID: "1-2", Status: messages.StatusSucceeded,
		Hosts: map[string]messages.HostRecap{"evil-1": {Ok: 21, Changed: 2}}},
		Playbooks: []messages.PlaybookOutcome{{Playbook: "setup_server.yml", Status: "succeeded"}, {Playbook: "verify_server.yml", Status: "succeeded"}}}
	if enc, err = messages.EncodeResult(ok); err != nil {
		t.Fatal(err)
	}
	if err := store.FinishRun(ctx, db, okID, 1, "succeeded", "", enc); err != nil {
		t.Fatal(err)
	}
	run("provisioning run succeeded", chromedp.Navigate(base+"/ui/runs/provision/"+okID), chromedp.WaitVisible(chromedp.CSS("#playbooks")))
	if got := text("#run-status"); got != "succeeded" {
		t.Fatalf("provisioning run's second attempt: status %q", got)
	}
	if got := strings.Fields(text("table.recap tbody")); !slices.Equal(got, []string{"evil-1", "21", "2", "0", "0", "0"}) {
		t.Fatalf("provisioning run's second recap: %q", got)
	}
	screenshot("provision-run-succeeded")
	w.check(t, "provisioning run succeeded")

	// The deployment form shows the API's validation next to the field.
	w.expecting(422)
	run("invalid deployment", chromedp.Navigate(base+"/ui/deploy"), chromedp.WaitVisible(chromedp.CSS("#deploy-submit")),
		chromedp.SetValue(chromedp.CSS("#f-project_id"), "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"),
		chromedp.SetValue(chromedp.CSS("#f-repo_full_name"), "acme/shop"),
		chromedp.SetValue(chromedp.CSS("#f-server_ip"), "not-an-address"),
		chromedp.SetValue(chromedp.CSS("#f-port"), "8080"),
		chromedp.Click(chromedp.CSS("#deploy-submit")), chromedp.WaitVisible(chromedp.CSS("#e-server_ip")))
	screenshot("deploy-form")
	w.check(t, "invalid deployment")

	// A valid one goes to its page, whose live output arrives over SSE.
	run("deploy", chromedp.SetValue(chromedp.CSS("#f-server_ip"), "198.51.100.7"),
		chromedp.SetValue(chromedp.CSS("#f-correlation_id"), "live"),
		chromedp.Click(chromedp.CSS("#deploy-submit")), chromedp.WaitVisible(chromedp.CSS("#live-output")))
	waitFor("live output starts", `document.querySelector("#live-output").textContent.includes("run started")`, false)
	// The page follows the run without a reload: status and start time.
	waitFor("the status follows the run", `document.querySelector("#run-status").textContent === "running" && document.querySelector("#run-started").textContent.trim() !== "-"`, false)
	close(release)
	waitFor("live output of the tasks", `document.querySelector("#live-output").textContent.includes("changed: [")`, false)
	waitFor("the run ends live", `document.querySelector("#live-output").textContent.includes("run finished")`, false)
	waitFor("the final status live", `!["running", "queued"].includes(document.querySelector("#run-status").textContent)`, false)
	if got := text("#live-output"); !strings.Contains(got, xss) || strings.Contains(got, "[0;33m") {
		t.Fatalf("live output does not show the event message as text, its colours rendered:\n%s", got)
	}
	// ANSI colours became spans; a play's header shows once, not per line.
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#live-output span.ansi-33").length`)); n == 0 {
		t.Error("the ANSI colour of the event messages is not rendered")
	}
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#live-output .ev-play").length`)); n != 1 {
		t.Errorf("%d play headers in the live output, want 1", n)
	}
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); n != 0 {
		t.Fatal("the live output made an img element of an event")
	}
	screenshot("deployment-live")
	w.check(t, "live output")
	run("full log", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#run-status")))
	waitFor("full log after the end", `!!document.querySelector("#full-log")`, true)
	screenshot("deployment-done")
	w.check(t, "deployment done")

	// Run again, filled in from it: this time the server does not answer.
	run("deploy again", chromedp.Click(chromedp.CSS("#run-again")), chromedp.WaitVisible(chromedp.CSS("#deploy-submit")))
	waitFor("the form filled in", `document.getElementById("f-server_ip").value === "198.51.100.7" && document.getElementById("f-port").value === "8080"`, false)
	run("deploy again submitted", chromedp.SetValue(chromedp.CSS("#f-correlation_id"), "unreachable"),
		chromedp.Click(chromedp.CSS("#deploy-submit")), chromedp.WaitVisible(chromedp.CSS("#run-status")))
	waitFor("unreachable", `document.querySelector("#run-status").textContent.trim() === "unreachable"`, true)
	waitFor("its outcome shown", `document.querySelector("main").textContent.includes("ssh_unreachable")`, true)
	screenshot("deployment-unreachable")
	w.check(t, "deployment unreachable")

	// Cancel one.
	run("deploy to cancel", chromedp.Navigate(base+"/ui/deploy"), chromedp.WaitVisible(chromedp.CSS("#deploy-submit")),
		chromedp.SetValue(chromedp.CSS("#f-project_id"), "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"),
		chromedp.SetValue(chromedp.CSS("#f-repo_full_name"), "acme/shop"),
		chromedp.SetValue(chromedp.CSS("#f-server_ip"), "198.51.100.8"),
		chromedp.SetValue(chromedp.CSS("#f-port"), "8081"),
		chromedp.SetValue(chromedp.CSS("#f-correlation_id"), "hold"),
		chromedp.Click(chromedp.CSS("#deploy-submit")), chromedp.WaitVisible(chromedp.CSS("#cancel")))
	waitFor("it runs", `document.querySelector("#live-output").textContent.includes("run started")`, false)
	run("cancel", chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	waitFor("cancelled", `document.querySelector("#run-status").textContent.trim() === "cancelled"`, true)
	w.check(t, "cancel")

	// An Ansible job from its form: the API's error next to a field, then
	// live output whose task names (markup) show as text.
	w.expecting(422)
	run("invalid job", chromedp.Navigate(base+"/ui/job"), chromedp.WaitVisible(chromedp.CSS("#job-submit")),
		chromedp.SetValue(chromedp.CSS("#f-project_id"), "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"),
		chromedp.SetValue(chromedp.CSS("#f-inventory\\.hosts"), "web-1:\n  ansible_host: 198.51.100.7\ndb-1: {}\n"),
		chromedp.Click(chromedp.CSS("#job-submit")), chromedp.WaitVisible(chromedp.CSS("#e-source\\.repository")))
	screenshot("job-form")
	w.check(t, "invalid job")
	// The refusal's summary has the focus; a collection's role hides the
	// playbook's fields, and the playbook's shows them again.
	waitFor("the error summary focused", `document.activeElement !== null && document.activeElement.id === "error-summary"`, false)
	choose := func(sel, v string) string {
		return `(function () { var s = document.getElementById("` + sel + `"); s.value = "` + v +
			`"; s.dispatchEvent(new Event("change")); return true; })()`
	}
	sourceType := func(v string) string { return choose("f-source.type", v) }
	// An inventory type shows its own fields only.
	waitFor("inline hosts shown, git's hidden", `document.getElementById("f-inventory.hosts").offsetParent !== null && document.getElementById("f-inventory.repository").offsetParent === null`, false)
	waitFor("a git inventory chosen", choose("f-inventory.type", "git"), false)
	waitFor("git's fields shown, inline hosts hidden", `document.getElementById("f-inventory.repository").offsetParent !== null && document.getElementById("f-inventory.credential").offsetParent !== null && document.getElementById("f-inventory.hosts").offsetParent === null && document.getElementById("f-inventory.url").offsetParent === null`, false)
	waitFor("an inline inventory chosen again", choose("f-inventory.type", "inline"), false)
	waitFor("a collection's role chosen", sourceType("collection_role"), false)
	waitFor("the playbook's fields hidden", `document.getElementById("f-source.paths").offsetParent === null && document.getElementById("f-source.role").offsetParent !== null`, false)
	waitFor("a playbook chosen", sourceType("playbook"), false)
	waitFor("the playbook's fields shown", `document.getElementById("f-source.paths").offsetParent !== null`, false)
	run("job", chromedp.SetValue(chromedp.CSS("#f-source\\.repository"), "https://git.example.com/org/playbooks.git"),
		chromedp.SetValue(chromedp.CSS("#f-source\\.paths"), "site.yml"),
		chromedp.Click(chromedp.CSS("#job-submit")), chromedp.WaitVisible(chromedp.CSS("#live-output")))
	waitFor("job live output starts", `document.querySelector("#live-output").textContent.includes("run started")`, false)
	close(releaseJob)
	waitFor("the job ends live", `document.querySelector("#live-output").textContent.includes("run finished")`, false)
	if got := text("#live-output"); !strings.Contains(got, xss+" 2") || !strings.Contains(got, "[db-1]") {
		t.Fatalf("job live output:\n%s", got)
	}
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); n != 0 {
		t.Fatal("the job's live output made an img element of a task name")
	}
	screenshot("job-live")
	w.check(t, "job live output")
	run("job done", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#run-status")))
	// Times in the reader's own zone, how long ago, UTC on hover.
	waitFor("local times", `(function () { var t = document.querySelector("time[datetime]");
		return t !== null && t.textContent.includes("ago") && t.title.endsWith(" UTC"); })()`, false)
	// Dark mode: the toggle, kept across pages; its screenshot; back.
	run("dark mode", chromedp.Click(chromedp.CSS("#theme-toggle")))
	waitFor("dark colours", `document.documentElement.getAttribute("data-theme") === "dark" &&
		document.getElementById("theme-toggle").getAttribute("aria-pressed") === "true" &&
		getComputedStyle(document.body).backgroundColor === "rgb(17, 20, 24)"`, false)
	run("dark mode kept", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#run-status")))
	waitFor("dark after a reload", `document.documentElement.getAttribute("data-theme") === "dark"`, false)
	screenshot("job-done-dark")
	run("light mode", chromedp.Click(chromedp.CSS("#theme-toggle")))
	waitFor("light colours", `getComputedStyle(document.body).backgroundColor === "rgb(255, 255, 255)"`, false)
	w.check(t, "dark mode")
	waitFor("the job's log after the end", `!!document.querySelector("#full-log") && !!document.querySelector("#playbooks")`, true)
	if got := text("main"); !strings.Contains(got, xss+" 2") || !strings.Contains(got, "db-1") {
		t.Fatalf("job page:\n%s", got)
	}
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); n != 0 {
		t.Fatal("the job's page made an img element of a task name")
	}
	screenshot("job-done")
	w.check(t, "job done")
	// Search in the log: only the lines holding the text stay, the count
	// is said, and every line's number links to it.
	run("log search", chromedp.SendKeys(chromedp.CSS("#log-search"), "db-1"))
	waitFor("only the matching lines shown", `(function () {
		var ls = Array.from(document.querySelectorAll("#full-log .log-line")), shown = ls.filter(function (l) { return !l.hidden; });
		return shown.length > 0 && shown.length < ls.length && shown.every(function (l) { return l.textContent.includes("db-1"); }) &&
			document.getElementById("log-matches").textContent === shown.length + " of " + ls.length + " lines" &&
			document.querySelector('#full-log a.ln[href="#L1"]') !== null; })()`, false)
	w.check(t, "log search")

	// Run again, filled in from it: this run fails, and says where.
	run("job again", chromedp.Click(chromedp.CSS("#run-again")), chromedp.WaitVisible(chromedp.CSS("#job-submit")))
	waitFor("the job form filled in", `document.getElementById("f-source.repository").value === "https://git.example.com/org/playbooks.git"`, false)
	run("job again submitted", chromedp.Click(chromedp.CSS("#job-submit")), chromedp.WaitVisible(chromedp.CSS("#run-status")))
	waitFor("the job failed", `document.querySelector("#run-status").textContent.trim() === "failed" && !!document.querySelector("#failed-task")`, true)
	if got := text("#failed-task"); !strings.Contains(got, "fails 1") || !strings.Contains(got, "web-1") && !strings.Contains(got, "db-1") {
		t.Fatalf("failed job's task: %q", got)
	}
	screenshot("job-failed")
	w.check(t, "job failed")

	// The runs list holds deployments, jobs and provisioning runs, newest
	// first.
	run("runs", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")))
	if got := text("#runs"); !strings.Contains(got, "deployment") || !strings.Contains(got, "provision") || !strings.Contains(got, "job") {
		t.Fatalf("runs list:\n%s", got)
	}
	screenshot("runs")
	w.check(t, "runs")

	// A POST without the CSRF token is refused (sent from the page, with
	// the session's cookie).
	w.expecting(403)
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/ui/keys", {method: "POST", body: new URLSearchParams({name: "sneaky", scope: "admin"})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != 403 {
		t.Fatalf("POST without CSRF: %d %v", status, err)
	}
	w.check(t, "csrf")

	// Queues: a dead letter is replayed.
	run("queues", chromedp.Navigate(base+"/ui/queues"), chromedp.WaitVisible(chromedp.CSS("table.dead")))
	screenshot("queues")
	// Dropping one asks first; Cancel leaves it.
	run("drop", chromedp.Click(chromedp.CSS(`table.dead button.danger`)), chromedp.WaitVisible(chromedp.CSS(`input[name="confirm"] ~ .actions button.danger`)))
	if got := text("h1"); !strings.Contains(got, "?") {
		t.Fatalf("the drop's confirmation asks %q", got)
	}
	screenshot("confirm-drop")
	run("drop cancelled", chromedp.Click(chromedp.CSS(`.actions a`)), chromedp.WaitVisible(chromedp.CSS("table.dead")))
	w.check(t, "drop asks first")
	run("replay", chromedp.Click(chromedp.CSS(`table.dead button.secondary`)), chromedp.WaitVisible(chromedp.CSS(".flash")))
	if got := text(".flash"); !strings.Contains(got, "replayed as") {
		t.Fatalf("replay: %q", got)
	}
	entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil || len(entries) != 1 || entries[0].Values[stream.ReplayFieldBy] != "console:operator" {
		t.Fatalf("replayed entry: %v %v", entries, err)
	}
	w.check(t, "replay")

	// Overview and keys.
	run("overview", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#runs-chart")))
	if got := text("#server-counts"); !strings.Contains(got, "READY") {
		t.Fatalf("overview counts: %q", got)
	}
	screenshot("overview")
	// The chart's labels stay readable at a phone's width (they were about
	// 5 px high once).
	run("overview on a phone", chromedp.EmulateViewport(390, 844))
	labels, err := chromedp.Run(bctx, chromedp.Evaluate[[]float64](`Array.from(document.querySelectorAll("#runs-chart text")).map(e => e.getBoundingClientRect().height)`))
	if err != nil || len(labels) == 0 {
		t.Fatalf("the chart's labels: %v %v", labels, err)
	}
	if low := slices.Min(labels); low < 10 {
		t.Errorf("a chart label is %.1f px high at a phone's width, want at least 10", low)
	}
	run("overview on a laptop", chromedp.EmulateViewport(1366, 768))
	w.check(t, "overview")
	run("keys", chromedp.Navigate(base+"/ui/keys"), chromedp.WaitVisible(chromedp.CSS("#keys")))
	screenshot("keys")
	w.check(t, "keys")
	run("credentials", chromedp.Navigate(base+"/ui/credentials"), chromedp.WaitVisible(chromedp.CSS("#credentials")))
	screenshot("credentials")
	w.check(t, "credentials")
	// Templates: one made through the API, with a survey of each type
	// (bar secret: no Vault here), a schedule and a trigger; the list, its
	// page (its description is markup), the launch form refused by field,
	// and a trigger's rotated secret, shown once.
	apiPost := func(path string, body any) map[string]any {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		var out map[string]any
		if res.StatusCode >= 300 || json.Unmarshal(data, &out) != nil {
			t.Fatalf("POST %s: %d %s", path, res.StatusCode, data)
		}
		return out
	}
	tpl := apiPost("/api/v1/templates", map[string]any{"project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "name": "site",
		"description": xss, "ask_on_launch": map[string]any{"limit": true, "extra_vars": true, "ref": true},
		"job": map[string]any{"source": map[string]any{"type": "playbook", "repository": "https://git.example.com/org/playbooks.git",
			"paths": []string{"site.yml"}}, "inventory": map[string]any{"type": "inline", "hosts": map[string]any{"web-1": map[string]any{}}}},
		"survey": []map[string]any{
			{"variable": "release", "label": "Release", "type": "text", "required": true, "default": "1.0", "max_length": 20},
			{"variable": "replicas", "type": "integer", "min": 1, "max": 5, "default": 2},
			{"variable": "env", "type": "choice", "choices": []string{"staging", "prod"}, "default": "staging"},
			{"variable": "features", "type": "multi_choice", "choices": []string{"a", "b"}},
		}})
	tplID, _ := tpl["id"].(string)
	apiPost("/api/v1/templates/"+tplID+"/schedules", map[string]any{"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin"})
	apiPost("/api/v1/templates/"+tplID+"/triggers", map[string]any{"name": "push-main", "provider": "github", "branches": []string{"main"}})
	run("templates", chromedp.Navigate(base+"/ui/templates"), chromedp.WaitVisible(chromedp.CSS("#templates")))
	screenshot("templates")
	w.check(t, "templates")
	run("template", chromedp.Navigate(base+"/ui/templates/"+tplID), chromedp.WaitVisible(chromedp.CSS("#survey")))
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("main img").length`)); n != 0 {
		t.Fatal("the template's page made an img element of its description")
	}
	screenshot("template")
	w.check(t, "template")
	w.expecting(422)
	run("invalid launch", chromedp.Click(chromedp.CSS("#launch")), chromedp.WaitVisible(chromedp.CSS("#launch-submit")),
		chromedp.SetValue(chromedp.CSS("#f-survey\\.replicas"), "9"),
		chromedp.Click(chromedp.CSS("#launch-submit")), chromedp.WaitVisible(chromedp.CSS("#e-survey\\.replicas")))
	screenshot("launch-form")
	w.check(t, "invalid launch")
	run("rotate", chromedp.Navigate(base+"/ui/templates/"+tplID), chromedp.WaitVisible(chromedp.CSS("#trigger-list")),
		chromedp.Click(chromedp.CSS("#trigger-list button.secondary")), chromedp.WaitVisible(chromedp.CSS("#confirm-rotate")))
	run("rotated", chromedp.Click(chromedp.CSS("#confirm-rotate")), chromedp.WaitVisible(chromedp.CSS("#new-secret")))
	screenshot("trigger-secret")
	w.check(t, "rotate")
	// Workflows: one made through the API (an approval, then the
	// template), launched: the list, its graph, and the run waiting for
	// its approval, with the form to decide it.
	wf := apiPost("/api/v1/workflows", map[string]any{"project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "name": "release",
		"description": xss, "nodes": []map[string]any{
			{"id": "approve", "approval": map[string]any{"description": "ship " + xss + "?"}},
			{"id": "deploy", "template_id": tplID, "launch": map[string]any{"survey": map[string]any{"release": "1.1"}}}},
		"edges": []map[string]any{{"from": "approve", "to": "deploy", "on": "success"}}})
	wfID, _ := wf["id"].(string)
	wfRun := apiPost("/api/v1/workflows/"+wfID+"/launch", map[string]any{})
	wfRunID, _ := wfRun["id"].(string)
	run("workflows", chromedp.Navigate(base+"/ui/workflows"), chromedp.WaitVisible(chromedp.CSS("#workflows")))
	screenshot("workflows")
	w.check(t, "workflows")
	run("workflow", chromedp.Navigate(base+"/ui/workflows/"+wfID), chromedp.WaitVisible(chromedp.CSS("#workflow-graph")))
	screenshot("workflow")
	w.check(t, "workflow")
	run("workflow run", chromedp.Navigate(base+"/ui/workflow-runs/"+wfRunID), chromedp.WaitVisible(chromedp.CSS("#approve-approve")))
	if n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("main img").length`)); n != 0 {
		t.Fatal("the workflow run's page made an img element of the approval's description")
	}
	screenshot("workflow-run")
	w.check(t, "workflow run")
	// A run that does not exist: a page that says so, not a bare error.
	w.expecting(404)
	run("no such job", chromedp.Navigate(base+"/ui/runs/job/00000000-0000-4000-8000-000000000000"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if got := text("main"); !strings.Contains(got, "Not Found") || !strings.Contains(got, "no job has this id") {
		t.Fatalf("a missing job's page:\n%s", got)
	}
	screenshot("not-found")
	w.check(t, "not found")

	// Sign out: the session is gone.
	run("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#key")))
	run("after sign-out", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#key")))
	if loc := location(); !strings.HasPrefix(loc, "/ui/signin") {
		t.Fatalf("after sign-out at %s", loc)
	}
	w.check(t, "sign out")
}

// seedConsole makes the servers and the dead letter the browser test
// looks at: a server whose label and last error hold markup (a handle
// cannot: the database checks its shape), a pinned host key.
func seedConsole(t *testing.T, ctx context.Context, db *pgxpool.Pool, rdb *redis.Client) {
	t.Helper()
	hostKey := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
	for _, s := range []struct{ handle, addr, status, labels, lastError string }{
		{"web-1", "192.0.2.10", "READY", `{"role": "web"}`, ""},
		{"evil-1", "192.0.2.11", "FAILED", `{"name": "` + strings.ReplaceAll(xss, `"`, `\"`) + `"}`, xss},
	} {
		if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address, status, labels, last_error, host_key) VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6)`,
			s.handle, s.addr, s.status, s.labels, s.lastError, hostKey); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerQueue + stream.DeadLetterSuffix, Values: map[string]any{
		messages.DataField: "not really msgpack", stream.DeadFieldReason: "handler_error", stream.DeadFieldError: xss,
		stream.DeadFieldStream: messages.StreamProvisionerQueue, stream.DeadFieldID: "1-1", stream.DeadFieldGroup: "infra",
		stream.DeadFieldConsumer: "infra-1", stream.DeadFieldDeliveries: "5", stream.DeadFieldAt: time.Now().UTC().Format(time.RFC3339Nano),
	}}).Err(); err != nil {
		t.Fatal(err)
	}
}
