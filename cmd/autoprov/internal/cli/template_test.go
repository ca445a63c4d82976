package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// siteTemplate is a template of the test project: a playbook on one host,
// a launch may set the limit and the ref, with a survey of two questions.
const siteTemplate = `{"name":"site","description":"the site",
	"job":{"source":{"type":"playbook","repository":"https://git.example.com/org/pb.git","paths":["site.yml"]},
		"inventory":{"type":"inline","hosts":["198.51.100.7"]}},
	"ask_on_launch":{"limit":true,"ref":true},
	"survey":[{"variable":"release","type":"text","required":true,"default":"1.0"},
		{"variable":"replicas","type":"integer","min":1,"max":9}]}`

// writeFile writes data to a file of the test's own and returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// createTemplate creates siteTemplate with `template create` and returns
// its id.
func createTemplate(t *testing.T, env map[string]string) string {
	t.Helper()
	stdout, stderr, code := run(t, env, "--json", "template", "create", writeFile(t, "site.json", siteTemplate))
	var tpl struct{ ID string }
	if code != 0 || json.Unmarshal([]byte(stdout), &tpl) != nil || tpl.ID == "" {
		t.Fatalf("template create: %d %s %s", code, stdout, stderr)
	}
	return tpl.ID
}

// TestTemplateCommands: `autoprov template` against the real deployer:
// create, list, show, update (a show --json edited: a new version; the
// same file again is a conflict unless --force), versions, delete; a
// template the API refuses names the fields; a key of another project
// finds none of them, a key without templates:write may not create.
func TestTemplateCommands(t *testing.T) {
	t.Parallel()
	d := startDeployer(t)
	env := d.cliEnv(d.key(t, "templates:write", testProject))

	stdout, stderr, code := run(t, env, "template", "create", writeFile(t, "site.json", siteTemplate))
	if code != 0 || !strings.Contains(stdout, "template site ") || !strings.Contains(stdout, "version: 1 of 1") ||
		!strings.Contains(stdout, "a launch may set: limit, ref") || !strings.Contains(stdout, "playbook site.yml of https://git.example.com/org/pb.git") {
		t.Fatalf("template create: %d %s %s", code, stdout, stderr)
	}
	id := strings.Fields(stdout)[2]
	if !strings.Contains(stdout, "release") || !strings.Contains(stdout, `"1.0"`) {
		t.Errorf("the survey is not shown:\n%s", stdout)
	}

	bad := strings.Replace(siteTemplate, `"type":"integer"`, `"type":"colour"`, 1)
	bad = strings.Replace(bad, `"name":"site"`, `"name":"other"`, 1)
	if _, stderr, code := run(t, env, "template", "create", writeFile(t, "bad.json", bad)); code != ExitFailed ||
		!strings.Contains(stderr, "create the template: HTTP 422") || !strings.Contains(stderr, "\n  survey[1].type: ") {
		t.Errorf("an invalid template: %d %s", code, stderr)
	}
	if _, stderr, code := run(t, env, "template", "create", writeFile(t, "bad.json", "{")); code != ExitUsage || !strings.Contains(stderr, "not valid JSON") {
		t.Errorf("a file that is not JSON: %d %s", code, stderr)
	}

	if stdout, stderr, code := run(t, env, "template", "list"); code != 0 || !strings.Contains(stdout, id) || !strings.Contains(stdout, "the site") {
		t.Errorf("template list: %d %s %s", code, stdout, stderr)
	}

	// show --json, edited, is what update takes.
	shown, stderr, code := run(t, env, "--json", "template", "show", id)
	if code != 0 {
		t.Fatalf("template show: %d %s", code, stderr)
	}
	edited := writeFile(t, "edited.json", strings.Replace(shown, `"the site"`, `"the site, edited"`, 1))
	if stdout, stderr, code := run(t, env, "template", "update", id, edited); code != 0 || !strings.Contains(stdout, "version: 2 of 2") ||
		!strings.Contains(stdout, "the site, edited") {
		t.Fatalf("template update: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, env, "template", "update", id, edited); code != ExitFailed || !strings.Contains(stderr, "HTTP 409") ||
		!strings.Contains(stderr, "\n  version: ") {
		t.Errorf("an update from an old version: %d %s", code, stderr)
	}
	if stdout, stderr, code := run(t, env, "template", "update", "--force", id, edited); code != 0 || !strings.Contains(stdout, "version: 3 of 3") {
		t.Errorf("template update --force: %d %s %s", code, stdout, stderr)
	}
	stdout, stderr, code = run(t, env, "template", "versions", id)
	if lines := strings.Split(strings.TrimSpace(stdout), "\n"); code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[1], "3 ") ||
		!strings.HasPrefix(lines[3], "1 ") {
		t.Errorf("template versions: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "template", "show", id, "--version", "1"); code != 0 || !strings.Contains(stdout, "version: 1 of 3") ||
		!strings.Contains(stdout, "description: the site\n") {
		t.Errorf("template show --version 1: %d %s %s", code, stdout, stderr)
	}

	// Tenancy: another project's key finds nothing.
	other := d.cliEnv(d.key(t, "templates:write", "0c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f"))
	for _, args := range [][]string{{"template", "show", id}, {"template", "versions", id}, {"template", "delete", id},
		{"template", "update", id, edited}} {
		if _, stderr, code := run(t, other, args...); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
			t.Errorf("%v with another project's key: %d %s", args, code, stderr)
		}
	}
	if stdout, stderr, code := run(t, other, "template", "list"); code != 0 || strings.TrimSpace(stdout) != "no templates" {
		t.Errorf("template list with another project's key: %d %s %s", code, stdout, stderr)
	}
	reader := d.cliEnv(d.key(t, "templates:read", testProject))
	if _, stderr, code := run(t, reader, "template", "create", writeFile(t, "site.json", siteTemplate)); code != ExitFailed ||
		!strings.Contains(stderr, "HTTP 403") || !strings.Contains(stderr, "templates:write") {
		t.Errorf("create with a read-only key: %d %s", code, stderr)
	}

	if stdout, stderr, code := run(t, env, "template", "delete", id); code != 0 || stdout != "template "+id+" deleted\n" {
		t.Errorf("template delete: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, env, "template", "show", id); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
		t.Errorf("a deleted template: %d %s", code, stderr)
	}
}
