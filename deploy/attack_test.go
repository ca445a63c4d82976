//go:build containers

package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// attackPlaybook is an Ansible job's code that looks, from infra's side
// (pipe lookups run where ansible-playbook runs), for what a job must never
// reach in the container deployment (issue 31): infra's SSH key file (its
// digest, which redaction would not hide), infra's state directory with
// the sources cache of every project's clones, and the environment of
// infra's processes (Redis and database URLs). Each answer is printed
// behind a marker; the last task proves the job reached its host.
const attackPlaybook = `- name: Look around infra
  hosts: all
  gather_facts: false
  tasks:
    - name: Infra's SSH key
      ansible.builtin.debug:
        msg: "KEYSUM[{{ lookup('ansible.builtin.pipe', 'sha256sum /keys/id_ed25519 2>&1; true') }}]"
    - name: Infra's state directory
      ansible.builtin.debug:
        msg: "STATE[{{ lookup('ansible.builtin.pipe', 'ls -A /var/lib/autoprov 2>&1 | paste -sd , -; true') }}]"
    - name: Infra's sources cache
      ansible.builtin.debug:
        msg: "CACHE[{{ lookup('ansible.builtin.pipe', 'ls -A /var/lib/autoprov/autoprov-sources 2>&1 | paste -sd , -; true') }}]"
    - name: Infra's environment
      ansible.builtin.debug:
        msg: "PROCS[{{ lookup('ansible.builtin.pipe', 'grep -a -o -e DATABASE_URL= -e REDIS_URL= /proc/[0-9]*/environ 2>/dev/null | wc -l') }}]"
    - name: The job's host
      ansible.builtin.command: hostname
      changed_when: false
`

// jobAttack is where the attack runs: the API, the playbook repository,
// the host directory of project secrets infra reads, a scratch directory
// and the stack's psql.
type jobAttack struct {
	api, repo, keys, dir string
	psql                 func(string) string
}

// jobCannotReachInfra runs attackPlaybook as an Ansible job of a project
// through the API, on the demo target with the project's own SSH key (a
// credential), and checks that it ran and found nothing of infra's: with
// PLAYBOOK_SANDBOX=off in the infra image (the forms before issue 31) it
// printed the key's digest, the sources cache and infra's environment.
func jobCannotReachInfra(ctx context.Context, t *testing.T, s *stack, a jobAttack) {
	infraC := s.container("infra", 1)
	sum, err := s.Exec(ctx, infraC, "sha256sum", "/keys/id_ed25519")
	if err != nil || len(strings.Fields(sum)) == 0 {
		t.Fatalf("infra's key digest: %q %v", sum, err)
	}
	infraKeySum := strings.Fields(sum)[0]

	// The project's key: authorized for the target's deploy user, stored
	// where infra reads project secrets, named by a credential.
	keyFile := filepath.Join(a.dir, "job-key")
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "job", "-f", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	priv, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(keyFile + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	project := uuidV4(t)
	ref := "file:projects/" + project + "/job-ssh" // as DEPLOY_SECRET_REFS allows the project
	stored := filepath.Join(a.keys, "projects", project, "job-ssh")
	if err := os.MkdirAll(filepath.Dir(stored), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stored, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(stored, 10001, 10001); err != nil {
		t.Fatal(err)
	}
	user := a.psql("SELECT COALESCE(NULLIF(ssh_user, ''), 'deploy') FROM servers WHERE handle = 'local-target'")
	if _, err := s.Exec(ctx, s.container("target", 1), "sh", "-c",
		fmt.Sprintf(`home=$(getent passwd %s | cut -d: -f6) && printf '%%s\n' '%s' >> "$home/.ssh/authorized_keys"`,
			user, strings.TrimSpace(string(pub)))); err != nil {
		t.Fatalf("authorize the project's key for %s on the target: %v", user, err)
	}

	created, err := s.Exec(ctx, s.container("deployer", 1), "deployer", "keys", "create", "--name", "job-attack",
		"--scopes", "jobs:write,jobs:read,credentials:write", "--fleet-wide", "--json")
	if err != nil {
		t.Fatal(err)
	}
	key := regexp.MustCompile(`"key":\s*"([^"]+)"`).FindStringSubmatch(created)
	if key == nil {
		t.Fatalf("deployer keys create: %s", created)
	}
	var cred map[string]any
	if code := apiCall(ctx, t, "POST", a.api+"/credentials", key[1],
		fmt.Sprintf(`{"project_id":%q,"name":"job-ssh","ref":%q}`, project, ref), &cred); code != 201 {
		t.Fatalf("POST /credentials: %d %v", code, cred)
	}
	body := fmt.Sprintf(`{"project_id":%q,
		"source":{"type":"playbook","repository":%q,"ref":"main","paths":["attack.yml"]},
		"inventory":{"type":"inline","hosts":{"t1":{"autoprov_server":"local-target"}}},
		"credentials":{"ssh":"job-ssh"},"options":{"timeout":600}}`, project, a.repo)
	var job struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Result any    `json:"result"`
	}
	if code := apiCall(ctx, t, "POST", a.api+"/jobs", key[1], body, &job); code != 202 || job.ID == "" {
		t.Fatalf("POST /jobs: %d %+v", code, job)
	}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		apiCall(ctx, t, "GET", a.api+"/jobs/"+job.ID+"?wait=30s", key[1], "", &job)
		if job.Status != "queued" && job.Status != "running" && job.Status != "" {
			break
		}
	}
	var log string
	apiCall(ctx, t, "GET", a.api+"/jobs/"+job.ID+"/logs", key[1], "", &log)
	if job.Status != "succeeded" {
		t.Fatalf("job %s ended %q (%+v)\nlog:\n%s\ninfra:\n%s", job.ID, job.Status, job.Result, log,
			lastLines(s.Logs(ctx, infraC), 30))
	}
	t.Logf("the job's findings:\n%s", strings.Join(regexp.MustCompile(`(KEYSUM|STATE|CACHE|PROCS)\[[^\]]*\]`).FindAllString(log, -1), "\n"))

	found := func(marker string) string {
		m := regexp.MustCompile(marker + `\[([^\]]*)\]`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("the job printed no %s: it did not run its lookups\n%s", marker, log)
		}
		return m[1]
	}
	if got := found("KEYSUM"); strings.Contains(got, infraKeySum) || !strings.Contains(got, "No such file") {
		t.Errorf("the job read infra's SSH key file: %q", got)
	}
	if got := found("STATE"); strings.Contains(got, "autoprov-sources") {
		t.Errorf("the job sees infra's state directory with its sources cache: %q", got)
	}
	if got := found("CACHE"); !strings.Contains(got, "No such file") {
		t.Errorf("the job lists infra's sources cache (every project's clones): %q", got)
	}
	if got := found("PROCS"); strings.TrimSpace(got) != "0" {
		t.Errorf("the job read %s environment entries of infra's processes (Redis and database URLs), want 0", got)
	}
}
