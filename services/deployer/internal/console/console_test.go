package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
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
	for _, sc := range res.Cookies() {
		_ = sc
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

	// A key bound to projects sees neither the fleet nor the keys.
	ci := newBrowser(t, e.URL)
	ci.signIn(e.CI)
	for p, want := range map[string]int{"/ui/fleet": http.StatusForbidden, "/ui/keys": http.StatusForbidden,
		"/ui/queues": http.StatusForbidden, "/ui/runs": http.StatusOK, "/ui/deploy": http.StatusOK} {
		if res, body := ci.get(p); res.StatusCode != want {
			t.Fatalf("ci key %s: %d, want %d\n%s", p, res.StatusCode, want, body)
		}
	}

	// Revoking the key ends its sessions at once.
	res, _ = b.post("/ui/keys/"+e.CIID+"/revoke", url.Values{"csrf": {csrf}})
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
