package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// gitServer is git's smart HTTP server (git http-backend behind net/http/cgi)
// that answers only requests carrying the token the way GitHub accepts it.
type gitServer struct {
	URL        string
	root       string
	authorized atomic.Int32
	refused    atomic.Int32
}

func startGitServer(t *testing.T, listenAddr, token string) *gitServer {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	gs := &gitServer{root: t.TempDir()}
	backend := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Root: "/",
		Env:  []string{"GIT_PROJECT_ROOT=" + gs.root, "GIT_HTTP_EXPORT_ALL=1"},
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
	l, err := net.Listen("tcp", net.JoinHostPort(listenAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			gs.refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		gs.authorized.Add(1)
		backend.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	gs.URL = "http://" + l.Addr().String()
	return gs
}

// workRepo is a working repository pushed to the git server.
type workRepo struct {
	t    *testing.T
	dir  string
	bare string
}

func (g *gitServer) newRepo(t *testing.T, path string) *workRepo {
	bare := filepath.Join(g.root, path)
	r := &workRepo{t: t, dir: t.TempDir(), bare: bare}
	r.git("init", "--quiet", "--bare", "--initial-branch=main", bare)
	r.git("-C", r.dir, "init", "--quiet", "--initial-branch=main")
	return r
}

func (r *workRepo) git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.dir, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes files, commits and pushes; returns the commit id.
func (r *workRepo) commit(files map[string]string, remove ...string) string {
	r.t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	for _, name := range remove {
		r.git("-C", r.dir, "rm", "--quiet", name)
	}
	r.git("-C", r.dir, "add", "-A")
	r.git("-C", r.dir, "commit", "--quiet", "-m", "change")
	r.git("-C", r.dir, "push", "--quiet", r.bare, "main")
	return r.git("-C", r.dir, "rev-parse", "HEAD")
}

func installStandin(t *testing.T, tgt *target.Target) {
	t.Helper()
	data := readFile(t, filepath.Join(repoRoot(t), "ansible/tests/testdata/docker-standin.sh"))
	if err := os.WriteFile(tgt.Path("/usr/local/bin/docker"), []byte(data), 0o755); err != nil {
		t.Fatal(err)
	}
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// httpGetInTarget fetches a URL from inside the target's network namespace.
func httpGetInTarget(tgt *target.Target, url string) (string, error) {
	out, err := tgt.Run(context.Background(), "python3", "-c",
		"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())", url)
	return string(out), err
}

// findSecrets lists the files under dir that contain any of needles.
func findSecrets(t *testing.T, dir string, allowed map[string]bool, needles ...string) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if allowed["/"+rel] {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, n := range needles {
			if bytes.Contains(data, []byte(n)) {
				hits = append(hits, "/"+rel)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// TestDeployProject deploys a project from a real git server (smart HTTP,
// token required) to a Debian target: checkout, .env, compose call, wait,
// idempotency, rollback of a release that does not come up, a wrong token,
// and the token nowhere on the target's disk or in the output. The docker
// command on the target is the recording stand-in (no engine can run here).
func TestDeployProject(t *testing.T) {
	t.Parallel()
	requireTools(t, targetTools...)
	key := newKey(t)
	tgt := startTarget(t, key, targetOpts{})
	installStandin(t, tgt)
	r := newRunner(t, ansibleDir(t))

	token := "ghs_" + randomHex(t, 16)
	envSecret := "pw-" + randomHex(t, 8)
	envContent := "DATABASE_URL=postgres://app:" + envSecret + "@db/app\nMODE=production\n"
	gs := startGitServer(t, tgt.HostAddr, token)
	repo := gs.newRepo(t, "acme/shop.git")
	compose := "services:\n  web:\n    image: nginx\n    ports: [\"${PORT}:80\"]\n    profiles: [web]\n"
	commitA := repo.commit(map[string]string{"compose.yml": compose, "index.html": "release A\n"})

	projectID := "0b6c1a8e-3f55-4f7e-9a41-7d2b5e6c9f10"
	projectDir := "/srv/autoprov/projects/" + projectID
	deploy := func(tok string) *play {
		return runPlay(t, r, ansible.Spec{
			Playbook: "deploy_project.yml", Host: hostFor(tgt, "root"),
			Vars: map[string]any{
				"project_id": projectID, "repo": "acme/shop", "branch": "main", "port": 8080,
				"modules": []string{"web", "worker"}, "project_deploy_git_base_url": gs.URL,
				"project_deploy_wait_timeout": 15,
			},
			SecretEnv: map[string]string{"GITHUB_TOKEN": tok, "PROJECT_ENV": envContent},
			SSHKeys:   [][]byte{key.PEM},
		})
	}
	noLeak := func(t *testing.T, res *play, secrets ...string) {
		t.Helper()
		all := res.Output + res.EventText()
		for _, s := range secrets {
			if strings.Contains(all, s) {
				t.Errorf("output or events contain a secret (%d chars)", len(s))
			}
		}
	}
	header := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))

	first := deploy(token)
	mustSucceed(t, first, "srv-test")
	noLeak(t, first, token, header, envSecret)

	t.Run("checkout", func(t *testing.T) {
		cur, err := os.Readlink(tgt.Path(projectDir + "/current"))
		if err != nil || cur != projectDir+"/releases/"+commitA {
			t.Fatalf("current -> %q (%v), want release %s", cur, err, commitA)
		}
		if got := readFile(t, tgt.Path(cur+"/index.html")); got != "release A\n" {
			t.Errorf("index.html %q", got)
		}
		if readFile(t, tgt.Path(cur+"/compose.yml")) != compose {
			t.Errorf("compose.yml differs")
		}
		if _, err := os.Stat(tgt.Path(cur + "/.git")); err == nil {
			t.Errorf("release has a .git directory")
		}
		if gs.authorized.Load() == 0 || gs.refused.Load() != 0 {
			t.Errorf("git server: %d authorized, %d refused requests", gs.authorized.Load(), gs.refused.Load())
		}
	})

	t.Run("env file", func(t *testing.T) {
		envPath := tgt.Path(projectDir + "/shared/.env")
		if got := readFile(t, envPath); got != envContent {
			t.Errorf(".env content differs")
		}
		st, err := os.Stat(envPath)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf(".env mode %o, want 600", st.Mode().Perm())
		}
		if link, err := os.Readlink(tgt.Path(projectDir + "/releases/" + commitA + "/.env")); err != nil || link != projectDir+"/shared/.env" {
			t.Errorf("release .env link %q %v", link, err)
		}
	})

	t.Run("compose and wait", func(t *testing.T) {
		log := readFile(t, tgt.Path("/var/log/docker-standin.log"))
		want := fmt.Sprintf("docker compose --project-name autoprov-%s --project-directory %s/releases/%s --profile=web --profile=worker up --detach --remove-orphans --build PORT=8080",
			projectID, projectDir, commitA)
		if !strings.Contains(log, want) {
			t.Errorf("stand-in log lacks %q:\n%s", want, log)
		}
		if body, err := httpGetInTarget(tgt, "http://127.0.0.1:8080/index.html"); err != nil || body != "release A\n" {
			t.Errorf("service answers %q (%v)", body, err)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(readFile(t, tgt.Path(projectDir+"/deploy.json"))), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["commit"] != commitA || rec["port"] != float64(8080) || fmt.Sprint(rec["profiles"]) != "[web worker]" {
			t.Errorf("deploy.json: %v", rec)
		}
	})

	t.Run("token nowhere on disk", func(t *testing.T) {
		allowed := map[string]bool{projectDir + "/shared/.env": true}
		if hits := findSecrets(t, tgt.Upper, allowed, token, header); len(hits) > 0 {
			t.Errorf("token found in %v", hits)
		}
		if hits := findSecrets(t, tgt.Upper, allowed, envSecret); len(hits) > 0 {
			t.Errorf(".env secret found outside .env: %v", hits)
		}
		if cfg := readFile(t, tgt.Path(projectDir+"/repo.git/config")); strings.Contains(cfg, "extraheader") || strings.Contains(cfg, "x-access-token") {
			t.Errorf("repo config holds credentials:\n%s", cfg)
		}
	})

	t.Run("redeploy changes nothing", func(t *testing.T) {
		again := deploy(token)
		st := mustSucceed(t, again, "srv-test")
		if st.Changed != 0 {
			t.Errorf("redeploy of the same commit: %d changed: %v", st.Changed, again.Changed())
		}
	})

	t.Run("failed release rolls back", func(t *testing.T) {
		commitB := repo.commit(map[string]string{"index.html": "release B\n", "standin-fail": "the stand-in starts nothing\n"})
		res := deploy(token)
		if res.ExitCode == 0 {
			t.Fatalf("deploy of a release that never answers succeeded")
		}
		noLeak(t, res, token, header, envSecret)
		failures := strings.Join(res.Failures(), "\n")
		if !strings.Contains(failures, "release "+commitB+" did not come up on port 8080") || !strings.Contains(failures, "rolled back to "+commitA) {
			t.Errorf("failure message: %s", failures)
		}
		if cur, _ := os.Readlink(tgt.Path(projectDir + "/current")); cur != projectDir+"/releases/"+commitA {
			t.Errorf("current -> %q after rollback", cur)
		}
		if body, err := httpGetInTarget(tgt, "http://127.0.0.1:8080/index.html"); err != nil || body != "release A\n" {
			t.Errorf("after rollback the service answers %q (%v)", body, err)
		}
		log := readFile(t, tgt.Path("/var/log/docker-standin.log"))
		iB := strings.LastIndex(log, "--project-directory "+projectDir+"/releases/"+commitB)
		iA := strings.LastIndex(log, "--project-directory "+projectDir+"/releases/"+commitA)
		if iB < 0 || iA < iB {
			t.Errorf("expected compose up of B then of A:\n%s", log)
		}
	})

	t.Run("wrong token", func(t *testing.T) {
		repo.commit(map[string]string{"index.html": "release C\n"}, "standin-fail")
		wrong := "ghs_" + randomHex(t, 16)
		res := deploy(wrong)
		if res.ExitCode == 0 {
			t.Fatalf("deploy with a wrong token succeeded")
		}
		noLeak(t, res, wrong, token, envSecret)
		if f := strings.Join(res.Failures(), "\n"); !strings.Contains(f, "fetching acme/shop@main failed") {
			t.Errorf("failure message: %s", f)
		}
		if gs.refused.Load() == 0 {
			t.Errorf("the git server refused nothing")
		}
	})
}
