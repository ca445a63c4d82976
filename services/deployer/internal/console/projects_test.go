package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestServerProjectsPages: the fleet list and a server's page show its
// owning projects; an operator sets them with the server page's form (the
// history keeps who and why); a server whose source sets them has no form.
func TestServerProjectsPages(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	const other = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
	if _, err := e.DB.Exec(context.Background(), `INSERT INTO servers (handle, address, source, projects, projects_from_source)
		VALUES ('own-1', '192.0.2.10', 'manual', '{}', false), ('inv-1', '192.0.2.11', 'static:/inv', ARRAY[$1], true)`, other); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, e.URL)
	csrf := b.signIn(e.Admin)
	if _, page := b.get("/ui/fleet/own-1"); !strings.Contains(page, "fleet-only") || !strings.Contains(page, `id="projects-form"`) {
		t.Fatalf("a fleet-only server's page:\n%s", page)
	}
	res, page := b.post("/ui/fleet/own-1/projects", url.Values{"csrf": {csrf},
		"projects": {deployertest.Project + ",\n" + strings.ToUpper(other)}, "reason": {"tenants moved in"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("set projects: %d\n%s", res.StatusCode, page)
	}
	_, page = b.get("/ui/fleet/own-1")
	for _, want := range []string{deployertest.Project, other, "tenants moved in", "api:admin"} {
		if !strings.Contains(page, want) {
			t.Errorf("the server page lacks %q:\n%s", want, page)
		}
	}
	if _, page = b.get("/ui/fleet/inv-1"); strings.Contains(page, `id="projects-form"`) || !strings.Contains(page, "set by its source") {
		t.Errorf("a source's server offers the form:\n%s", page)
	}
	if res, page = b.post("/ui/fleet/inv-1/projects", url.Values{"csrf": {csrf}, "projects": {""}}); res.StatusCode != http.StatusConflict {
		t.Errorf("setting a source's server: %d, want 409\n%s", res.StatusCode, page)
	}
	if res, page = b.post("/ui/fleet/own-1/projects", url.Values{"csrf": {csrf}, "projects": {"tenant-b"}}); res.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("a bad project id: %d, want 422\n%s", res.StatusCode, page)
	}
	if _, page = b.get("/ui/fleet"); !strings.Contains(page, "<th>Projects</th>") || !strings.Contains(page, other[:8]) {
		t.Errorf("the fleet list shows no projects:\n%s", page)
	}
}
