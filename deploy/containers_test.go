//go:build containers

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// TestContainers runs what docker-compose.yml describes, with podman: the
// images scripts/containers.sh built (it runs this test: `make test`'s
// container lane and `make run-compose`), the compose stack with Redis,
// Postgres and the demo target as containers, the main job through it (the
// demo provisions the target: READY), then infra scaled to 3 and the
// replica running the next job killed mid-run, the job still finishing
// once. It needs root and podman (scripts/containers.sh deps).
//
// What it changes of the compose file, and why: the images come from
// localImages (no registry here); Vault and vault-init do not run (no
// Vault image here): infra reads the demo key from the demo-keys volume
// through a file: reference instead of vault:; infra's STREAM_LEASE is 10s
// so another replica takes the killed one's job over sooner.
func TestContainers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the container test runs podman as root (scripts/containers.sh test)")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: scripts/containers.sh deps")
	}
	// The stack's steps get the test's time but two minutes, which the
	// stack's stop and removal keep (on a loaded machine the steps take
	// more than 12 minutes: 816 s in a CI run beside the other tests).
	limit := time.Now().Add(25 * time.Minute)
	if d, ok := t.Deadline(); ok {
		limit = d.Add(-2 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), limit)
	defer cancel()
	begin := time.Now()
	step := func(format string, args ...any) {
		t.Logf("[%6.1fs] %s", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}

	t.Run("images run as their non-root user with their files", func(t *testing.T) {
		checks := map[string]string{
			"scheduler": "test -x /usr/local/bin/scheduler && test -x /usr/local/bin/autoprov",
			"deployer":  "test -x /usr/local/bin/deployer && test -x /usr/local/bin/autoprov",
			"infra": "test -x /usr/local/bin/infra && test -x /usr/local/bin/runguard && test -x /usr/local/bin/autoprov" +
				" && ansible-playbook --version >/dev/null && test -x \"$PLAYBOOK_BIN\" && test -x \"$PLAYBOOK_GUARD\"" +
				" && test -r \"$PLAYBOOK_DIR/playbooks/setup_server.yml\" && test -r \"$PLAYBOOK_DIR/ansible.cfg\"" +
				" && test -r \"$PLAYBOOK_DIR/plugins/callback/autoprov_events.py\" && test -d \"$PLAYBOOK_DIR/roles\"" +
				" && touch /var/lib/autoprov/w && ssh -V 2>/dev/null && bwrap --version >/dev/null && git --version >/dev/null",
			"demo": "python3 -c 'import msgpack, redis' && command -v psql >/dev/null && test -r /usr/local/bin/demo-job.py",
		}
		for img, check := range checks {
			out, err := podman(ctx, "run", "--rm", "--entrypoint", "sh", "localhost/autoprov/"+img+":dev",
				"-c", "id -u; id -g; "+check)
			if err != nil {
				t.Errorf("%s: %v", img, err)
				continue
			}
			if ids := strings.Fields(out); len(ids) < 2 || ids[0] != "10001" || ids[1] != "10001" {
				t.Errorf("%s runs as uid/gid %q, want 10001 10001", img, out)
			}
		}
		step("images checked")
	})
	if t.Failed() {
		return
	}

	// The stack's settings: fresh secrets, the API on a free loopback port.
	dir := t.TempDir()
	apiPort := freeLoopbackPort(t)
	envFile := filepath.Join(dir, "stack.env")
	env := fmt.Sprintf("POSTGRES_PASSWORD=%s\nVAULT_DEV_ROOT_TOKEN=%s\nDEPLOYER_PUBLISH=127.0.0.1:%d\n"+
		"INFRA_SSH_KEY_REF=file:id_ed25519\nINFRA_STOP_GRACE=20s\nSHUTDOWN_GRACE=10s\n",
		randomHex(t, 16), randomHex(t, 16), apiPort)
	if err := os.WriteFile(envFile, []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	project, err := loadCompose(t, filepath.Join(root, ".env.example"), envFile)
	if err != nil {
		t.Fatal(err)
	}
	project.Name = "autoprov-ct-" + randomHex(t, 3)
	infra := project.Services["infra"]
	dropEnv(&infra, "VAULT_ADDR", "VAULT_TOKEN")
	lease := "10s"
	infra.Environment["SECRETS_FILE_ROOT"] = ptr("/keys")
	infra.Environment["STREAM_LEASE"] = &lease
	infra.Volumes = append(infra.Volumes, types.ServiceVolumeConfig{Type: types.VolumeTypeVolume, Source: "demo-keys", Target: "/keys", ReadOnly: true})
	delete(infra.DependsOn, "vault-init")
	// Ansible jobs' own secrets (their credentials' file: references) are
	// read apart from infra's: a host directory the test writes a
	// project's SSH key into.
	projectKeys := filepath.Join(t.TempDir(), "project-keys")
	if err := os.Mkdir(projectKeys, 0o755); err != nil {
		t.Fatal(err)
	}
	infra.Environment["PROJECT_SECRETS_FILE_ROOT"] = ptr("/project-keys")
	secretRefs := "vault:secret/projects/{project_id}/**,file:projects/{project_id}/**"
	infra.Environment["DEPLOY_SECRET_REFS"] = &secretRefs
	deployer := project.Services["deployer"]
	deployer.Environment["DEPLOY_SECRET_REFS"] = &secretRefs
	project.Services["deployer"] = deployer
	infra.Volumes = append(infra.Volumes, types.ServiceVolumeConfig{Type: types.VolumeTypeBind, Source: projectKeys, Target: "/project-keys", ReadOnly: true})
	project.Services["infra"] = infra

	s := newStack(ctx, t, project)
	step("network and volumes of %s created", project.Name)
	psql := func(query string) string {
		t.Helper()
		out, err := s.Exec(ctx, s.container("postgres", 1), "psql", "-U", "autoprov", "-d", "autoprov", "-tAc", query)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	s.Start(ctx, "redis")
	// (The network's bridge exists once a container is on it.) The demo
	// deployment's project, served over git's smart HTTP from
	// this machine on the stack network's gateway (as make run serves it
	// on the host's end of its target's veth); infra's site variables say
	// where (they replace deploy/docker/site-vars.json's mount).
	gateway, err := podman(ctx, "network", "inspect", "--format", "{{range .Subnets}}{{.Gateway}}{{end}}", s.network)
	if err != nil || net.ParseIP(gateway) == nil {
		t.Fatalf("gateway of %s: %q %v", s.network, gateway, err)
	}
	gitURL := serveDemoProject(ctx, t, dir, gateway)
	siteVars := filepath.Join(dir, "site-vars.json")
	vars := `{"autoprov_manage_kernel": false, "docker_install_source": "debian",
 "system_tuning_swap_size_mb": 64, "system_tuning_swap_min_free_mb": 256,
 "project_deploy_git_base_url": "` + gitURL + `", "project_deploy_wait_timeout": 30}`
	if err := os.WriteFile(siteVars, []byte(vars), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, v := range infra.Volumes {
		if v.Target == "/etc/autoprov/site-vars.json" {
			infra.Volumes[i].Source = siteVars
		}
	}
	// Jobs' repositories are served over plain HTTP on the gateway.
	infra.Environment["SOURCES_ALLOW_HTTP"] = ptr("true")
	infra.Environment["SOURCES_ALLOW_NETWORKS"] = ptr(gateway + "/32")
	project.Services["infra"] = infra
	for _, svc := range []string{"postgres", "scheduler", "deployer", "infra", "demo-keys", "target"} {
		s.Start(ctx, svc)
	}
	for _, svc := range []string{"scheduler", "deployer", "infra", "target"} {
		s.WaitHealthy(ctx, s.container(svc, 1), 3*time.Minute)
	}
	step("stack up: redis, postgres, scheduler, deployer, infra, target healthy")
	// Named volumes belong to the user that writes them, not to root.
	for svc, check := range map[string]string{
		"infra":    "stat -c '%U %a' /var/lib/autoprov && test -w /var/lib/autoprov",
		"redis":    "stat -c '%U %a' /data && test -w /data",
		"postgres": "stat -c '%U %a' \"$PGDATA\" && test -w \"$PGDATA\"",
	} {
		out, err := s.Exec(ctx, s.container(svc, 1), "sh", "-c", check)
		want := map[string]string{"infra": "autoprov", "redis": "redis", "postgres": "postgres"}[svc]
		if err != nil || !strings.HasPrefix(out, want+" ") {
			t.Errorf("%s: its volume is %q (%v), want owned and writable by %s", svc, out, err, want)
		}
	}

	// Each step needs the one before: after a failure the stack is only
	// stopped (and checked to stop cleanly).
	ok := t.Run("main job: the demo target provisioned READY", func(t *testing.T) {
		demo := s.Start(ctx, "demo")
		// Bounded well inside the test's time, so that a stuck job leaves
		// time to say why (the state of its runs and locks, last).
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
		code, err := s.WaitExit(wctx, demo)
		wcancel()
		out := s.Logs(ctx, demo)
		if err != nil || code != 0 {
			// The database's answers, errors included: nothing may end
			// the test before it says why.
			query := func(q string) string {
				out, err := s.Exec(ctx, s.container("postgres", 1), "psql", "-U", "autoprov", "-d", "autoprov", "-tAc", q)
				if err != nil {
					return err.Error()
				}
				return out
			}
			// First on one line, which make test's summary keeps: what
			// held the server when the demo gave up.
			t.Errorf("demo's end: runs [%s]; leases [%s]",
				strings.Join(strings.Fields(query("SELECT string_agg(job_id || ' ' || kind || ' ' || state || '/' || coalesce(status, '') || ' #' || attempt, ', ' ORDER BY created_at) FROM runs")), " "),
				strings.Join(strings.Fields(query("SELECT string_agg(key || ' by ' || job, ', ') FROM run_leases")), " "))
			t.Fatalf("demo exited %d (%v):\n%s\ninfra, without its waiting lines:\n%s\nthe database:\n%s",
				code, err, lastLines(out, 40), lastLines(dropLines(s.Logs(ctx, s.container("infra", 1)), "entry not done yet", "waiting for another run"), 80),
				runState(query))
		}
		t.Logf("demo output (last lines):\n%s", lastLines(out, 15))
		// The demo ends with infra's result; the scheduler reads it
		// from provisioner:results and marks the server after that.
		got := ""
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
			if got = psql("SELECT status FROM servers WHERE handle = 'local-target'"); got == "READY" || time.Now().After(deadline) {
				break
			}
		}
		if got != "READY" {
			t.Fatalf("local-target is %q 2 minutes after the demo's success, want READY; the database:\n%s\nscheduler:\n%s",
				got, runState(psql), lastLines(s.Logs(ctx, s.container("scheduler", 1)), 40))
		}
		step("main job done: local-target READY")
	})

	ok = ok && t.Run("a deployment through the API", func(t *testing.T) {
		// No Docker engine runs in the target container: the docker CLI
		// there is the Ansible tests' recording stand-in, as in make run.
		standin, _ := filepath.Abs(filepath.Join(root, "ansible", "tests", "testdata", "docker-standin.sh"))
		if _, err := podman(ctx, "cp", standin, s.container("target", 1)+":/usr/local/bin/docker"); err != nil {
			t.Fatal(err)
		}
		created, err := s.Exec(ctx, s.container("deployer", 1), "deployer", "keys", "create", "--name", "container-test",
			"--scopes", "deployments:write,servers:read", "--fleet-wide", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var key struct{ Key string }
		if err := json.Unmarshal([]byte(created), &key); err != nil || key.Key == "" {
			t.Fatalf("deployer keys create: %v", err)
		}
		addr := psql("SELECT address FROM servers WHERE handle = 'local-target'")
		base := fmt.Sprintf("http://127.0.0.1:%d/api/v1", apiPort)
		body := fmt.Sprintf(`{"project_id":"%s","repo_full_name":"acme/demo","branch":"main","server_ip":"%s","port":8080,"modules":["web"],"options":{"timeout_seconds":600}}`,
			uuidV4(t), addr)
		var dep struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Result *struct {
				Error string `json:"error"`
			} `json:"result"`
		}
		code := apiCall(ctx, t, "POST", base+"/deployments", key.Key, body, &dep)
		if code != 202 || dep.ID == "" {
			t.Fatalf("POST /deployments: %d %+v", code, dep)
		}
		step("deployment %s accepted", dep.ID)
		for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
			apiCall(ctx, t, "GET", base+"/deployments/"+dep.ID+"?wait=30s", key.Key, "", &dep)
			if dep.Status != "queued" && dep.Status != "running" && dep.Status != "" {
				break
			}
		}
		if dep.Status != "succeeded" {
			t.Fatalf("deployment %s ended %q (%+v)\ninfra:\n%s", dep.ID, dep.Status, dep.Result, lastLines(s.Logs(ctx, s.container("infra", 1)), 30))
		}
		// The stand-in serves the deployed project on its port.
		page, err := s.Exec(ctx, s.container("target", 1), "python3", "-c",
			"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/index.html').read().decode())")
		if err != nil || !strings.Contains(page, "demo deployed by autoprovisioner") {
			t.Errorf("the deployed project is not served on the target: %q %v", page, err)
		}
		step("deployment %s succeeded", dep.ID)
	})

	ok = ok && t.Run("a job's code sees nothing of infra's", func(t *testing.T) {
		jobCannotReachInfra(ctx, t, s, jobAttack{api: fmt.Sprintf("http://127.0.0.1:%d/api/v1", apiPort),
			repo: gitURL + "/acme/demo.git", keys: projectKeys, dir: dir, psql: psql})
		step("an Ansible job ran sandboxed: infra's key, cache and environment out of its reach")
	})

	scaled := ok && t.Run("infra scaled to 3, the replica running the job killed", func(t *testing.T) {
		for range 2 {
			s.WaitHealthy(ctx, s.Start(ctx, "infra"), 3*time.Minute)
		}
		step("infra scaled to 3")
		// A fresh target: the first play closed root login on the old one.
		s.Recreate(ctx, "target")
		s.WaitHealthy(ctx, s.container("target", 1), 3*time.Minute)
		demo := s.Recreate(ctx, "demo")
		killed := ""
		// The replica running the demo's job (the scheduler may run plays of
		// its own meanwhile), while its play runs.
		for deadline := time.Now().Add(3 * time.Minute); killed == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			m := jobID.FindStringSubmatch(s.Logs(ctx, demo))
			if m == nil {
				continue // not published yet
			}
			for n := 1; n <= 3; n++ {
				c := s.container("infra", n)
				if !playRunning(s.Logs(ctx, c), m[1]) {
					continue
				}
				if top, _ := podman(ctx, "top", c, "args"); strings.Contains(top, "ansible-playbook") {
					// A crash, not a stop: SIGKILL to the container's first
					// process from outside, so its restart policy applies.
					pid, err := podman(ctx, "inspect", "--format", "{{.State.Pid}}", c)
					if err != nil {
						t.Fatal(err)
					}
					if n, _ := strconv.Atoi(strings.TrimSpace(pid)); n <= 0 {
						continue // between a stop and a restart: no process to kill (kill 0 is our own group)
					}
					if out, err := exec.Command("kill", "-KILL", pid).CombinedOutput(); err != nil {
						t.Fatalf("kill %s (%s): %v %s", pid, c, err, out)
					}
					killed = c
					break
				}
			}
		}
		if killed == "" {
			t.Fatalf("no infra replica ran the play within 3 minutes; the demo's last lines:\n%s", lastLines(s.Logs(ctx, demo), 40))
		}
		step("killed %s mid-play", killed)
		code := s.Wait(ctx, demo)
		out := s.Logs(ctx, demo)
		if code != 0 {
			t.Fatalf("demo exited %d after %s was killed; the demo's last lines:\n%s\nthe replicas' lines of the job:\n%s",
				code, killed, lastLines(out, 30), s.jobLines(ctx, "infra", 3, jobID.FindStringSubmatch(out)))
		}
		step("the job finished after the kill")
		if got := psql("SELECT status FROM servers WHERE handle = 'local-target'"); got != "READY" {
			t.Errorf("local-target is %q, want READY", got)
		}
		m := jobID.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no job_id in the demo's output:\n%s", out)
		}
		// Taken over (a second attempt), finished once: one run, done,
		// and one READY transition of the server for the job.
		run := psql("SELECT state || ' ' || status || ' ' || attempt FROM runs WHERE job_id = '" + m[1] + "'")
		var state, status string
		var attempt int
		fmt.Sscan(run, &state, &status, &attempt)
		if state != "done" || status != "succeeded" || attempt < 2 {
			t.Errorf("run of %s: %q, want done succeeded with attempt >= 2 (taken over after the kill)\n%s:\n%s",
				m[1], run, killed, lastLines(s.Logs(ctx, killed), 40))
		}
		if n := psql("SELECT count(*) FROM server_history WHERE job_id = '" + m[1] + "' AND to_status = 'READY'"); n != "1" {
			t.Errorf("%s moved local-target to READY %s times, want once", m[1], n)
		}
		restarts, _ := podman(ctx, "inspect", "--format", "{{.RestartCount}} {{.State.Status}}", killed)
		step("run of %s: %s; %s after the kill (restarts, state): %s", m[1], run, killed, restarts)
	})

	t.Run("the stack stops cleanly", func(t *testing.T) {
		codes := s.Down(ctx)
		for name, code := range codes {
			if code != 0 && code != 137 || code == 137 && !strings.Contains(name, "-infra-") {
				t.Errorf("%s exited %d on stop; its last lines:\n%s", name, code, s.lastWords[name])
			}
		}
		if scaled && len(codes) < 10 {
			t.Errorf("stopped %d containers, want the stack's 10: %v", len(codes), codes)
		}
		step("stack stopped and removed")
	})
}

// jobID finds the job id in the demo's output (its first line, the
// published request, and its printed result).
var jobID = regexp.MustCompile(`"job_id": "([^"]+)"`)

// playRunning tells whether infra's logs show the play of job id started
// and the job not finished.
func playRunning(logs, id string) bool {
	started := false
	for line := range strings.Lines(logs) {
		if !strings.Contains(line, `"job_id":"`+id+`"`) {
			continue
		}
		switch {
		case strings.Contains(line, `"message":"job finished"`):
			return false
		case strings.Contains(line, `"message":"ansible-playbook started"`):
			started = true
		}
	}
	return started
}

// Recreate removes replica 1 of a service and starts it anew.
func (s *stack) Recreate(ctx context.Context, svc string) string {
	s.t.Helper()
	if _, err := podman(ctx, "rm", "-f", s.container(svc, 1)); err != nil {
		s.t.Fatal(err)
	}
	s.replicas[svc] = 0
	return s.Start(ctx, svc)
}

func ptr[T any](v T) *T { return &v }

// lastLines returns the last n lines of s.
// jobLines returns the log lines of the job that match[1] names, from
// replicas 1..n of svc, each prefixed with its replica (the last 20 each).
func (s *stack) jobLines(ctx context.Context, svc string, n int, match []string) string {
	if match == nil {
		return "(no job id)"
	}
	var b strings.Builder
	for i := 1; i <= n; i++ {
		c := s.container(svc, i)
		var lines []string
		for line := range strings.Lines(s.Logs(ctx, c)) {
			if strings.Contains(line, match[1]) {
				lines = append(lines, strings.TrimRight(line, "\n"))
			}
		}
		fmt.Fprintf(&b, "%s:\n%s\n", c, lastLines(strings.Join(lines, "\n"), 20))
	}
	return b.String()
}

// dropLines returns s without the lines that contain any of noise.
func dropLines(s string, noise ...string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !slices.ContainsFunc(noise, func(n string) bool { return strings.Contains(line, n) }) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// runState describes, through psql, the runs, their locks and leases and
// the lines of waiting jobs: what a job that never started was waiting for.
func runState(psql func(string) string) string {
	var b strings.Builder
	for _, q := range []string{
		`SELECT handle, status, pending_job_id, version FROM servers ORDER BY handle`,
		`SELECT job_id, kind, target, state, status, owner, attempt, started_at, updated_at FROM runs ORDER BY created_at`,
		`SELECT key, holder, job, expires_at FROM run_leases ORDER BY job`,
		`SELECT target, job, seq, since, seen_at FROM run_waits ORDER BY seq`,
		`SELECT l.objid, l.granted, a.pid, a.state, a.backend_start, a.query_start, left(a.query, 60)
		 FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' ORDER BY a.pid`,
		`SELECT now()`,
	} {
		fmt.Fprintf(&b, "%s\n%s\n", strings.Join(strings.Fields(q), " "), psql(q))
	}
	return b.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// serveDemoProject makes the demo project (a compose file and a page, as
// scripts/demo-deploy.sh does) a bare repository acme/demo.git, serves it
// with scripts/gitserve on addr and returns its base URL.
func serveDemoProject(ctx context.Context, t *testing.T, dir, addr string) string {
	t.Helper()
	work, repos := filepath.Join(dir, "git-work"), filepath.Join(dir, "git")
	if err := os.MkdirAll(filepath.Join(repos, "acme"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"compose.yml": "services:\n  web:\n    image: nginx\n    ports: [\"${PORT}:80\"]\n    profiles: [web]\n",
		"index.html":  "<h1>demo deployed by autoprovisioner</h1>\n",
		"attack.yml":  attackPlaybook,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitEnv := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+work, "GIT_AUTHOR_NAME=demo",
		"GIT_AUTHOR_EMAIL=demo@example.com", "GIT_COMMITTER_NAME=demo", "GIT_COMMITTER_EMAIL=demo@example.com")
	for _, args := range [][]string{
		{"init", "-q", "--initial-branch=main", "."}, {"add", "-A"}, {"commit", "-q", "-m", "demo project"},
		{"clone", "-q", "--bare", ".", filepath.Join(repos, "acme", "demo.git")},
	} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir, cmd.Env = work, gitEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	bin := filepath.Join(dir, "gitserve")
	src, _ := filepath.Abs(filepath.Join(root, "scripts", "gitserve", "main.go"))
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build gitserve: %v %s", err, out)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	srv := exec.Command(bin, "--listen", listen, "--root", repos)
	srv.Stdout, srv.Stderr = os.Stderr, os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	for i := 0; i < 50; i++ {
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "http://" + listen
}

// apiCall sends a request to the deployer's API with the key and decodes
// the JSON answer into out (a *string: the body as it is); it returns the
// status code.
func apiCall(ctx context.Context, t *testing.T, method, url, key, body string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuidV4(t))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if text, ok := out.(*string); ok {
		*text = string(data)
		return resp.StatusCode
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, data, err)
	}
	return resp.StatusCode
}

// uuidV4 returns a random UUID.
func uuidV4(t *testing.T) string {
	h := randomHex(t, 16)
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:]
}
