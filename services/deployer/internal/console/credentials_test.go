package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestCredentialsPage: a project's key lists, adds and deletes its
// project's credentials on their page (field errors shown, a typed value
// never echoed), the job form offers their names, and another project's
// key sees none of them.
func TestCredentialsPage(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	const other = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"
	scopes := []auth.Scope{auth.ScopeCredentialsRead, auth.ScopeCredentialsWrite, auth.ScopeJobsWrite, auth.ScopeJobsRead}
	a := newBrowser(t, e.URL)
	csrf := a.signIn(e.Key("creds-a", scopes, deployertest.Project))
	if _, page := a.get("/ui/"); !strings.Contains(page, `href="/ui/credentials"`) {
		t.Errorf("no Credentials in the navigation:\n%s", page)
	}
	if _, page := a.get("/ui/credentials"); !strings.Contains(page, "No credentials yet.") || !strings.Contains(page, deployertest.Project) {
		t.Fatalf("the empty page (with the key's project in the form):\n%s", page)
	}

	ref := "vault:secret/projects/" + deployertest.Project + "/ssh#private_key"
	res, page := a.post("/ui/credentials", url.Values{"csrf": {csrf}, "project_id": {deployertest.Project},
		"name": {"prod-ssh"}, "ref": {ref}, "description": {"the web servers"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("add: %d\n%s", res.StatusCode, page)
	}
	_, page = a.get("/ui/credentials?done=created+prod-ssh")
	for _, want := range []string{"prod-ssh", ref, "the web servers", "created prod-ssh"} {
		if !strings.Contains(page, want) {
			t.Errorf("the list lacks %q:\n%s", want, page)
		}
	}

	const typed = "typed-secret-4711"
	for name, tc := range map[string]struct {
		form url.Values
		want string
	}{
		"a taken name":              {url.Values{"name": {"prod-ssh"}, "ref": {ref}}, "prod-ssh"},
		"another project's path":    {url.Values{"name": {"stolen"}, "ref": {"vault:secret/projects/" + other + "/ssh"}}, "ref"},
		"a value without Vault":     {url.Values{"name": {"by-value"}, "value": {typed}}, "value"},
		"a reference and no scheme": {url.Values{"name": {"bad"}, "ref": {"secret/x"}}, "ref"},
	} {
		tc.form.Set("csrf", csrf)
		tc.form.Set("project_id", deployertest.Project)
		res, page := a.post("/ui/credentials", tc.form)
		if res.StatusCode < 400 || res.StatusCode >= 500 || !strings.Contains(page, `id="credential-error"`) || !strings.Contains(page, tc.want) {
			t.Errorf("%s: %d, want a 4xx page with the error naming %q:\n%s", name, res.StatusCode, tc.want, page)
		}
		if strings.Contains(page, typed) {
			t.Errorf("%s: the typed value is in the page", name)
		}
	}

	// The job form offers the project's credentials by name.
	if _, page := a.get("/ui/job"); !strings.Contains(page, `<datalist id="credential-names"><option value="prod-ssh">`) ||
		!strings.Contains(page, `list="credential-names"`) {
		t.Errorf("the job form offers no credential names:\n%s", page)
	}

	// Another project's key sees none of them, and cannot delete them.
	b := newBrowser(t, e.URL)
	csrfB := b.signIn(e.Key("creds-b", scopes, other))
	if _, page := b.get("/ui/credentials"); strings.Contains(page, "prod-ssh") || !strings.Contains(page, "No credentials yet.") {
		t.Errorf("project B sees A's credential:\n%s", page)
	}
	if _, page := b.get("/ui/job"); strings.Contains(page, "prod-ssh") {
		t.Errorf("project B's job form offers A's credential:\n%s", page)
	}
	if res, page := b.post("/ui/credentials/prod-ssh/delete", url.Values{"csrf": {csrfB}, "project_id": {deployertest.Project},
		"confirm": {"yes"}}); res.StatusCode < 400 {
		t.Errorf("B deleted A's credential: %d\n%s", res.StatusCode, page)
	}

	// Delete asks first, then deletes.
	res, page = a.post("/ui/credentials/prod-ssh/delete", url.Values{"csrf": {csrf}, "project_id": {deployertest.Project}})
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-delete"`) {
		t.Fatalf("delete without confirmation: %d\n%s", res.StatusCode, page)
	}
	res, page = a.post("/ui/credentials/prod-ssh/delete", url.Values{"csrf": {csrf}, "project_id": {deployertest.Project}, "confirm": {"yes"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("delete: %d\n%s", res.StatusCode, page)
	}
	if _, page = a.get("/ui/credentials"); strings.Contains(page, "prod-ssh") {
		t.Errorf("the deleted credential is still listed:\n%s", page)
	}
}
