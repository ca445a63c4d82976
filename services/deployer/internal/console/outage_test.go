package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestPostgresOutagePages503: with Postgres out of reach, a signed-in
// page (its session cannot be checked) and a sign-in (with a key the
// cache knows: no session can be made; with one it does not: the key
// cannot be checked) answer 503 with a Retry-After, and pages work again
// once Postgres is back.
func TestPostgresOutagePages503(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, proxy := deployertest.ProxiedPool(t)
	keys := auth.NewStore(pool)
	newKey := func(name string) string {
		_, secret, err := keys.Create(ctx, auth.NewKey{Name: name, Scopes: []auth.Scope{auth.ScopeDeploymentsWrite},
			Projects: []string{deployertest.Project}})
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	cached, uncached := newKey("ci"), newKey("ci-uncached")
	e := deployertest.Start(t, deployertest.Options{DB: pool, NoInfra: true, Env: map[string]string{"API_KEY_CACHE_TTL": "10m"}})
	signedIn := newBrowser(t, e.URL)
	signedIn.signIn(cached)
	// Sign-in forms fetched before the outage.
	signingIn := map[string]*browser{}
	forms := map[string]string{}
	for _, key := range []string{cached, uncached} {
		b := newBrowser(t, e.URL)
		_, page := b.get("/ui/signin")
		signingIn[key], forms[key] = b, csrfOf(t, page)
	}

	proxy.Cut()
	res, body := signedIn.get("/ui/")
	assertPageRetryLater(t, "a page of a session", res, body)
	for key, name := range map[string]string{cached: "a cached key", uncached: "an uncached key"} {
		res, body := signingIn[key].post("/ui/signin", url.Values{"csrf": {forms[key]}, "key": {key}, "next": {"/ui/"}})
		assertPageRetryLater(t, "signing in with "+name, res, body)
	}

	proxy.Restore()
	testenv.WaitFor(t, 30*time.Second, "pages to work again", func() bool {
		res, _ := signedIn.get("/ui/")
		return res.StatusCode == http.StatusOK
	})
}

// assertPageRetryLater checks that res is a 503 page with a Retry-After
// of a positive number of seconds.
func assertPageRetryLater(t *testing.T, what string, res *http.Response, body string) {
	t.Helper()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("%s with Postgres away: %d, want 503:\n%s", what, res.StatusCode, body)
		return
	}
	if n, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || n <= 0 {
		t.Errorf("%s with Postgres away: Retry-After %q, want a positive number of seconds", what, res.Header.Get("Retry-After"))
	}
}
