package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

// browser is a cookie-keeping HTTP client that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	res, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

func (b *browser) post(path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	res, err := b.c.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// events reads an event stream to its end, after last (a Last-Event-ID)
// when not "".
func (b *browser) events(path, last string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.base+path, nil)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	res, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

// signIn signs in with key and returns the session's CSRF token.
func (b *browser) signIn(key string) string {
	b.t.Helper()
	_, page := b.get("/ui/signin")
	res, body := b.post("/ui/signin", url.Values{"csrf": {csrfOf(b.t, page)}, "key": {key}, "next": {"/ui/"}})
	if res.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("sign in: %d\n%s", res.StatusCode, body)
	}
	_, page = b.get("/ui/")
	return csrfOf(b.t, page)
}

func TestSessionsAndCSRF(t *testing.T) {
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	b := newBrowser(t, e.URL)

	res, _ := b.get("/ui/fleet")
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/ui/signin") {
		t.Fatalf("page without a session: %d %s, want a redirect to the sign-in", res.StatusCode, res.Header.Get("Location"))
	}
	_, page := b.get("/ui/signin")
	res, body := b.post("/ui/signin", url.Values{"csrf": {csrfOf(t, page)}, "key": {"apk_" + strings.Repeat("a", 52)}})
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "not valid") {
		t.Fatalf("wrong key: %d\n%s", res.StatusCode, body)
	}
	res, _ = b.post("/ui/signin", url.Values{"key": {e.Admin}})
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-in without its CSRF token: %d, want 403", res.StatusCode)
	}

	csrf := b.signIn(e.Admin)
	var session *http.Cookie
	u, _ := url.Parse(e.URL + "/ui/")
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "autoprov_session" {
			session = c
		}
	}
	if session == nil {
		t.Fatal("no session cookie")
	}
	res, _ = b.get("/ui/")
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP %q", csp)
	}
	var stored int
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM console_sessions WHERE token_hash = sha256(convert_to('session:' || $1, 'UTF8'))`, session.Value).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("the session's hash is not what is stored: %d %v", stored, err)
	}
	var raw int
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM console_sessions WHERE token_hash = convert_to($1, 'UTF8')`, session.Value).Scan(&raw); err != nil || raw != 0 {
		t.Fatalf("the session token is stored as it is: %d %v", raw, err)
	}

	// A POST without the CSRF token is refused, and so is one with
	// another session's.
	res, _ = b.post("/ui/keys", url.Values{"name": {"x"}, "scope": {"admin"}})
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("POST without CSRF: %d", res.StatusCode)
	}
	res, _ = b.post("/ui/keys", url.Values{"csrf": {"forged"}, "name": {"x"}, "scope": {"admin"}})
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("POST with a wrong CSRF: %d", res.StatusCode)
	}

	// Every page renders for the admin.
	for _, p := range []string{"/ui/", "/ui/fleet", "/ui/runs", "/ui/deploy", "/ui/queues", "/ui/keys"} {
		if res, body := b.get(p); res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", p, res.StatusCode, body)
		}
	}

	// The deploy form's port is the application's, with no default: a
	// prefilled 22 published the app on the SSH port (issue 34).
	if _, body := b.get("/ui/deploy"); !strings.Contains(body, `for="f-port">Application port`) ||
		regexp.MustCompile(`id="f-port"[^>]*value="\d`).MatchString(body) {
		t.Errorf("deploy form's port field:\n%s", body)
	}

	// A key bound to projects sees neither the fleet nor the keys.
	ci := newBrowser(t, e.URL)
	ci.signIn(e.CI)
	for p, want := range map[string]int{"/ui/fleet": http.StatusForbidden, "/ui/keys": http.StatusForbidden,
		"/ui/queues": http.StatusForbidden, "/ui/runs": http.StatusOK, "/ui/deploy": http.StatusOK} {
		if res, body := ci.get(p); res.StatusCode != want {
			t.Fatalf("ci key %s: %d, want %d\n%s", p, res.StatusCode, want, body)
		}
	}

	// Revoking asks first: one click revokes nothing.
	res, page = b.post("/ui/keys/"+e.CIID+"/revoke", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-revoke"`) {
		t.Fatalf("revoke without confirmation: %d\n%s", res.StatusCode, page)
	}
	if res, _ := ci.get("/ui/runs"); res.StatusCode != http.StatusOK {
		t.Fatalf("the key's session after an unconfirmed revoke: %d", res.StatusCode)
	}
	// Revoking the key ends its sessions at once.
	res, _ = b.post("/ui/keys/"+e.CIID+"/revoke", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", res.StatusCode)
	}
	if res, _ := ci.get("/ui/runs"); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("a revoked key's session still works: %d", res.StatusCode)
	}

	// Sign-out ends the session on the server too.
	res, _ = b.post("/ui/signout", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: %d", res.StatusCode)
	}
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM console_sessions WHERE key_id = $1`, e.AdminID).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("sessions left after sign-out: %d %v", stored, err)
	}
}

// TestRunPagesAndEvents follows a deployment through the console: its
// events stream (the API's, as the session's key) resumes after
// Last-Event-ID, its page shows the outcome and the log, and the runs list
// pages with its cursor.
func TestRunPagesAndEvents(t *testing.T) {
	e := deployertest.Start(t, deployertest.Options{})
	id, b := deployAndSignIn(t, e)

	events := func(last string) (int, string) { return b.events("/ui/runs/deployment/"+id+"/events", last) }
	status, all := events("")
	if status != http.StatusOK || !strings.Contains(all, "event: run_started") || !strings.Contains(all, "event: run_finished") {
		t.Fatalf("events: %d\n%s", status, all)
	}
	ids := regexp.MustCompile(`(?m)^id: (\S+)$`).FindAllStringSubmatch(all, -1)
	if len(ids) < 3 {
		t.Fatalf("events without ids:\n%s", all)
	}
	status, rest := events(ids[0][1])
	if status != http.StatusOK || strings.Contains(rest, "id: "+ids[0][1]+"\n") || !strings.Contains(rest, "id: "+ids[1][1]+"\n") {
		t.Fatalf("resume after %s: %d\n%s", ids[0][1], status, rest)
	}
	if status, _ := events(ids[len(ids)-1][1]); status != http.StatusNoContent {
		t.Fatalf("resume after the end: %d, want 204", status)
	}

	res, page := b.get("/ui/runs/deployment/" + id)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="full-log"`) || !strings.Contains(page, "succeeded") ||
		!strings.Contains(page, "Download the log") {
		t.Fatalf("deployment page: %d\n%s", res.StatusCode, page)
	}
	if strings.Contains(page, "/ui/fleet/") {
		t.Errorf("a key without servers:read is shown the fleet's server:\n%s", page)
	}
	// The registered server at the deployment's address: its handle and a
	// link, for a key that reads the fleet.
	// It is the project's server, so that the project may deploy there.
	if _, err := e.DB.Exec(context.Background(), `INSERT INTO servers (handle, address, status, labels, source, projects)
		VALUES ('web-at-7', '198.51.100.7', 'READY', '{}', 'inventory', ARRAY[$1])`, deployertest.Project); err != nil {
		t.Fatal(err)
	}
	ab := newBrowser(t, e.URL)
	abCSRF := ab.signIn(e.Admin)
	if _, page := ab.get("/ui/runs/deployment/" + id); !strings.Contains(page, `href="/ui/fleet/web-at-7"`) ||
		!strings.Contains(page, "Application port") {
		t.Errorf("the deployment page for a fleet reader names no server:\n%s", page)
	}
	// A rebuild asks first, with the reason kept.
	if res, page := ab.post("/ui/fleet/web-at-7/rebuild", url.Values{"csrf": {abCSRF}, "reason": {"disk died"}}); res.StatusCode != http.StatusOK ||
		!strings.Contains(page, `id="confirm-rebuild"`) || !strings.Contains(page, `value="disk died"`) {
		t.Errorf("rebuild without confirmation: %d\n%s", res.StatusCode, page)
	}

	// Another key's project is not this key's: the API's visibility.
	other := e.Key("other", []auth.Scope{auth.ScopeDeploymentsRead}, "22222222-3333-4444-5555-666666666666")
	ob := newBrowser(t, e.URL)
	ob.signIn(other)
	if res, _ := ob.get("/ui/runs/deployment/" + id); res.StatusCode != http.StatusNotFound {
		t.Fatalf("another project's deployment: %d, want 404", res.StatusCode)
	}
	if _, page := ob.get("/ui/runs"); strings.Contains(page, id) {
		t.Fatal("another project's deployment is listed")
	}

	// Cursor paging: three more deployments, three per page.
	for range 3 {
		if res, body := e.Do(http.MethodPost, "/api/v1/deployments", e.CI, deployertest.Request()); res.StatusCode != http.StatusAccepted {
			t.Fatalf("deploy: %d %s", res.StatusCode, body)
		}
	}
	seen := map[string]bool{}
	path := "/ui/runs?kind=deployment&limit=3"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("the pages never end")
		}
		_, page := b.get(path)
		for _, m := range regexp.MustCompile(`/ui/runs/deployment/([0-9a-f-]{36})"`).FindAllStringSubmatch(page, -1) {
			if seen[m[1]] {
				t.Fatalf("%s listed twice", m[1])
			}
			seen[m[1]] = true
		}
		path = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next-page"`).FindStringSubmatch(page); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 4 {
		t.Fatalf("paged through %d deployments, want 4", len(seen))
	}
}

// TestSessionCookieAndExpiry checks the cookie's attributes (Secure only
// behind TLS or when told) and that a session ends at its expiry.
func TestSessionCookieAndExpiry(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("secure=%v", secure), func(t *testing.T) {
			env := map[string]string{"CONSOLE_SESSION_TTL": "2s"}
			if secure {
				env["CONSOLE_SECURE_COOKIES"] = "true"
			}
			e := deployertest.Start(t, deployertest.Options{NoInfra: true, Env: env})
			b := newBrowser(t, e.URL)
			_, page := b.get("/ui/signin")
			res, err := b.c.PostForm(e.URL+"/ui/signin", url.Values{"csrf": {csrfOf(t, page)}, "key": {e.Admin}})
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			var cookie *http.Cookie
			for _, c := range res.Cookies() {
				if c.Name == "autoprov_session" {
					cookie = c
				}
			}
			if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/ui" || cookie.Secure != secure {
				t.Fatalf("session cookie %+v (secure %v)", cookie, secure)
			}
			if secure {
				// A Secure cookie is not sent back over plain HTTP: the
				// test sends it itself to check the session works.
				req, _ := http.NewRequest(http.MethodGet, e.URL+"/ui/runs", nil)
				req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
				res, err := http.DefaultClient.Do(req)
				if err != nil || res.StatusCode != http.StatusOK {
					t.Fatalf("with the session: %v %v", res.StatusCode, err)
				}
				res.Body.Close()
				return
			}
			if res, _ := b.get("/ui/runs"); res.StatusCode != http.StatusOK {
				t.Fatalf("signed in: %d", res.StatusCode)
			}
			time.Sleep(2500 * time.Millisecond)
			req, _ := http.NewRequest(http.MethodGet, e.URL+"/ui/runs", nil)
			req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value}) // the browser would have dropped it
			res, err = b.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusSeeOther {
				t.Fatalf("an expired session still works: %d", res.StatusCode)
			}
		})
	}
}

// deployAndSignIn runs a deployment of the CI key to its end and returns
// its id and a browser signed in with that key.
func deployAndSignIn(t *testing.T, e *deployertest.Env) (string, *browser) {
	t.Helper()
	res, body := e.Do(http.MethodPost, "/api/v1/deployments?wait=30s", e.CI, deployertest.Request())
	if res.StatusCode != http.StatusOK {
		t.Fatalf("deploy: %d %s", res.StatusCode, body)
	}
	id := deployertest.JSON[map[string]any](t, body)["id"].(string)
	b := newBrowser(t, e.URL)
	b.signIn(e.CI)
	return id, b
}

// TestRunPageWithoutOutput: a run that stored no output says so and offers
// no log to download (the link answered 404).
func TestRunPageWithoutOutput(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{PlanFor: func(*messages.AnsibleDeployMessage) fakeinfra.Plan {
		return fakeinfra.Plan{} // no task, no output
	}})
	id, b := deployAndSignIn(t, e)
	res, page := b.get("/ui/runs/deployment/" + id)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, "No output was stored") || strings.Contains(page, "Download the log") {
		t.Fatalf("the page of a run without output: %d\n%s", res.StatusCode, page)
	}
}

// TestDeploymentRunAgain: a finished deployment's page offers Run again,
// which opens the deployment form filled in with its request; sent as it
// is, it makes a new deployment with the same request. Another project's
// key cannot fill the form from it.
func TestDeploymentRunAgain(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{})
	id, b := deployAndSignIn(t, e)
	if _, page := b.get("/ui/runs/deployment/" + id); !strings.Contains(page, `href="/ui/deploy?from=`+id+`" id="run-again"`) {
		t.Fatalf("a finished deployment's page offers no Run again:\n%s", page)
	}
	res, page := b.get("/ui/deploy?from=" + id)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="deploy-note"`) {
		t.Fatalf("run again: %d\n%s", res.StatusCode, page)
	}
	again := formValues(t, page)
	for name, want := range map[string]string{"project_id": deployertest.Project, "repo_full_name": "acme/shop",
		"branch": "main", "server_ip": "198.51.100.7", "port": "8080", "correlation_id": ""} {
		if got := again.Get(name); got != want {
			t.Errorf("run again: %s is %q, want %q", name, got, want)
		}
	}
	res, _ = b.post("/ui/deploy", again)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("run again, submitted: %d", res.StatusCode)
	}
	second := strings.TrimPrefix(res.Header.Get("Location"), "/ui/runs/deployment/")
	_, body := e.Do(http.MethodGet, "/api/v1/deployments/"+second, e.CI, nil)
	d := deployertest.JSON[map[string]any](t, body)
	req, _ := d["request"].(map[string]any)
	if second == id || req["repo_full_name"] != "acme/shop" || req["server_ip"] != "198.51.100.7" || req["port"] != float64(8080) {
		t.Errorf("the deployment run again (%s) is not the first one's request: %s", second, body)
	}
	stranger := newBrowser(t, e.URL)
	stranger.signIn(e.Key("deploy-other", []auth.Scope{auth.ScopeDeploymentsWrite}, "22222222-3333-4444-5555-666666666666"))
	if res, page := stranger.get("/ui/deploy?from=" + id); res.StatusCode != http.StatusNotFound || strings.Contains(page, "acme/shop") {
		t.Errorf("another project's key runs this deployment again: %d\n%s", res.StatusCode, page)
	}
}
