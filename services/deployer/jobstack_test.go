package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// jobRepo makes a git repository whose one commit, tagged v1, holds site
// as site.yml, and keeps its bare clone at <root>/org/ops.git.
func jobRepo(tb testing.TB, root, site string) {
	tb.Helper()
	work := filepath.Join(tb.TempDir(), "work")
	git := gitRunner(tb, root)
	git("init", "-q", "--initial-branch=main", work)
	if err := os.WriteFile(filepath.Join(work, "site.yml"), []byte(site), 0o644); err != nil {
		tb.Fatal(err)
	}
	git("-C", work, "add", "-A")
	git("-C", work, "commit", "-q", "-m", "site")
	git("-C", work, "tag", "v1")
	git("clone", "-q", "--bare", work, filepath.Join(root, "org", "ops.git"))
}

// jobRepoTag adds a commit to the repository of jobRepo at root, on top
// of its main branch, that writes files (path: content), and tags it tag.
func jobRepoTag(tb testing.TB, root, tag string, files map[string]string) {
	tb.Helper()
	work := filepath.Join(tb.TempDir(), "work")
	git := gitRunner(tb, root)
	git("clone", "-q", filepath.Join(root, "org", "ops.git"), work)
	for name, content := range files {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	git("-C", work, "add", "-A")
	git("-C", work, "commit", "-q", "-m", tag)
	git("-C", work, "tag", tag)
	git("-C", work, "push", "-q", "origin", "main", tag)
}

// gitRunner returns a function that runs git with args, HOME at home and
// a fixed author, and fails tb when git does.
func gitRunner(tb testing.TB, home string) func(args ...string) {
	return func(args ...string) {
		tb.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t",
			"GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// jobStack is the real deployer and infra, built from this tree, that the
// jobs end-to-end test and benchmark drive through the HTTP API with a
// project key holding the credentials "git" (gitToken) and "ssh" (sshKey).
type jobStack struct {
	root     string   // the repository's root
	bins     string   // infra, runguard, deployer
	infraEnv []string // every replica's settings but ADMIN_ADDR
	depEnv   []string
	api      string
	key      string // the project key (jobs:write, credentials:write)
	hookKey  string // its webhook secret
	deployer *testenv.Process
}

// jobStackProject is the project of the stack's key.
const jobStackProject = "3c9a7e10-5b2d-4f6e-8a1c-9d0e2f4b6a81"

// startJobStack builds the binaries, starts the deployer (its webhooks
// signed, allowed to loopback) and creates the key and its credentials;
// infra replicas start with startInfra. infraExtra adds infra settings.
func startJobStack(tb testing.TB, gitToken string, sshKey []byte, infraExtra ...string) *jobStack {
	tb.Helper()
	for _, tool := range []string{"ansible-playbook", "git", "sshd"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				tb.Fatalf("%s is missing (make test installs it)", tool)
			}
		}
	}
	root, err := target.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	s := &jobStack{root: root, bins: tb.TempDir()}
	dsn, redisURL := testenv.Postgres(tb), testenv.RedisDB(tb)
	const ap = "github.com/autoprovisioner/autoprovisioner/"
	for _, b := range []struct {
		out, pkg string
		static   bool
	}{
		{"infra", ap + "services/infra", false},
		{"runguard", ap + "pkg/ansible/cmd/runguard", true},
		{"deployer", ".", false},
	} {
		if err := testenv.GoBuild(filepath.Join(s.bins, b.out), b.pkg, b.static); err != nil {
			tb.Fatalf("build %s: %v", b.pkg, err)
		}
	}
	secretDir := tb.TempDir()
	const requestKey = "deployer-request-key-0123456789abcdef-0123456789"
	if err := os.WriteFile(filepath.Join(secretDir, "deployer-request-key"), []byte(requestKey), 0o600); err != nil {
		tb.Fatal(err)
	}
	runRoot := testenv.RunRoot(tb)
	// The targets are on loopback: both services let it through.
	common := []string{"DATABASE_URL=" + dsn, "REDIS_URL=" + redisURL, "LOG_FORMAT=json", "DEPLOY_SECRET_REFS=env:PROJ_SECRET_*",
		"SPECIAL_ALLOW_NETWORKS=127.0.0.0/8"}
	s.infraEnv = append(append(common,
		"PLAYBOOK_DIR="+filepath.Join(root, "ansible"), "PLAYBOOK_RUN_ROOT="+runRoot,
		"SECRETS_FILE_ROOT="+secretDir, "SSH_KEY_REF=env:AUTOPROV_SECRET_SSH_KEY", "AUTOPROV_SECRET_SSH_KEY="+string(sshKey),
		"SSH_BASE_DELAY=200ms", "SSH_ATTEMPT_TIMEOUT=3s",
		"DEPLOY_ALLOW_NETWORKS=127.0.0.0/8",
		"SOURCES_ALLOW_HTTP=true", "JOB_WORK_DIR="+filepath.Join(filepath.Dir(runRoot), "jobs"), // reachable to the sandbox's job users
		"SOURCES_CACHE_DIR="+filepath.Join(tb.TempDir(), "sources"),
		"PROJECT_SECRETS_ENV_PREFIX=PROJ_SECRET_", "PROJ_SECRET_GIT="+gitToken,
		// The targets are not registered servers: a job brings its own
		// SSH key (infra's key is never lent to a job).
		"PROJ_SECRET_SSH="+string(sshKey),
		"REQUEST_SIGNATURES=require", "REQUEST_KEYS=deployer-1@ansible:job:queue=file:deployer-request-key"), infraExtra...)
	api, admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb))
	s.api = api
	s.depEnv = append(common, "WEBHOOK_SIGNING_KEY=e2e-webhook-signing-key-0123456789abcdef")
	s.deployer = testenv.StartBinary(tb, filepath.Join(s.bins, "deployer"), testenv.BinaryEnv(append(s.depEnv, "API_ADDR="+api, "ADMIN_ADDR="+admin,
		"REQUEST_SIGNING_KEY_ID=deployer-1", "REQUEST_SIGNING_KEY="+requestKey, "WEBHOOK_ALLOW_CIDRS=127.0.0.1/32")...))
	s.deployer.WaitHTTP("http://"+admin+"/readyz", 200, 2*time.Minute)
	stdout, stderr, code := testenv.RunBinary(tb, filepath.Join(s.bins, "deployer"), testenv.BinaryEnv(s.depEnv...),
		"keys", "create", "--name", "ci", "--scopes", "jobs:write,credentials:write", "--project", jobStackProject, "--json")
	var created struct {
		Key           string `json:"key"`
		WebhookSecret string `json:"webhook_secret"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &created) != nil || created.WebhookSecret == "" {
		tb.Fatalf("keys create: %d %s %s", code, stdout, stderr)
	}
	s.key, s.hookKey = created.Key, created.WebhookSecret
	for _, c := range []string{`{"name":"git","ref":"env:PROJ_SECRET_GIT"}`, `{"name":"ssh","ref":"env:PROJ_SECRET_SSH"}`} {
		if code, resp := s.call(tb, "POST", "/credentials", c); code != 201 {
			tb.Fatalf("credential: %d %s", code, resp)
		}
	}
	return s
}

// startInfra starts one infra replica with the stack's settings and extra
// ones and waits until it is ready.
func (s *jobStack) startInfra(tb testing.TB, extra ...string) *testenv.Process {
	tb.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb))
	env := append(append(append([]string{}, s.infraEnv...), extra...), "ADMIN_ADDR="+admin)
	p := testenv.StartBinary(tb, filepath.Join(s.bins, "infra"), testenv.BinaryEnv(env...))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	return p
}

// call sends an API request with the stack's key and returns the status
// and body.
func (s *jobStack) call(tb testing.TB, method, path, body string) (int, string) {
	return apiCall(tb, s.api, s.key, method, path, body)
}

// apiCall sends a request to the deployer's API at addr with key and
// returns the status and body.
func apiCall(tb testing.TB, addr, key, method, path, body string) (int, string) {
	req, _ := http.NewRequest(method, "http://"+addr+"/api/v1"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
