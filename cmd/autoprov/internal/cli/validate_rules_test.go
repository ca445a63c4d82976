package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateRules: the scheduler's rules file is checked by the
// scheduler's own --check-config, from --rules or from RULES_FILE in the
// settings; each problem names the file and line; a good file passes.
func TestValidateRules(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	dir := t.TempDir()
	write := fileWriter(t, dir)
	env := map[string]string{"PATH": os.Getenv("PATH")}
	ansibleDir := filepath.Join(dir, "ansible")
	write("ansible/playbooks/nginx.yml", "- name: Nginx\n  hosts: all\n  tasks: []\n")
	good := write("rules.yml", "rules:\n  - name: web\n    match:\n      all:\n        - {label: role, equals: web}\n    playbooks: [nginx.yml]\n")
	bad := write("bad-rules.yml", "rules:\n  - name: web\n    match: {group: web}\n    playbooks: [missing.yml]\n")
	settings := write("s.env", "REDIS_URL=redis://redis:6379/0\nDATABASE_URL=postgres://u:pw@db/autoprov\n")

	out, errOut, code := run(t, env, "--env-file", settings, "validate", "--bin-dir", bin, "--service", "scheduler",
		"--rules", good, "--ansible-dir", ansibleDir, "--no-lint")
	if code != 0 || !strings.Contains(out, "ok   scheduler configuration ("+settings+") with rules "+good) {
		t.Fatalf("good rules: exit %d\n%s%s", code, out, errOut)
	}

	out, _, code = run(t, env, "--env-file", settings, "validate", "--bin-dir", bin, "--service", "scheduler",
		"--rules", bad, "--ansible-dir", ansibleDir, "--no-lint")
	if code != 1 {
		t.Fatalf("bad rules: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{"FAIL scheduler configuration", "RULES_FILE: " + bad + ":3: rule \"web\": unknown key \"group\"",
		bad + ":4: rule \"web\": playbook \"missing.yml\" does not exist", "2 problems"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// RULES_FILE in the settings is checked without --rules.
	withRules := write("r.env", "REDIS_URL=redis://redis:6379/0\nDATABASE_URL=postgres://u:pw@db/autoprov\nRULES_FILE="+bad+
		"\nPLAYBOOK_DIR="+ansibleDir+"\n")
	out, _, code = run(t, env, "--env-file", withRules, "validate", "--bin-dir", bin, "--service", "scheduler")
	if code != 1 || !strings.Contains(out, bad+":4:") {
		t.Fatalf("RULES_FILE in the settings: exit %d\n%s", code, out)
	}
	// A rules file that is not there.
	missing := write("m.env", "REDIS_URL=redis://redis:6379/0\nDATABASE_URL=postgres://u:pw@db/autoprov\nRULES_FILE="+filepath.Join(dir, "nope.yml")+"\n")
	out, _, code = run(t, env, "--env-file", missing, "validate", "--bin-dir", bin, "--service", "scheduler")
	if code != 1 || !strings.Contains(out, "RULES_FILE: read rules file") {
		t.Fatalf("missing rules file: exit %d\n%s", code, out)
	}
}
