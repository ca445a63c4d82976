package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runGitFetch runs the autoprov_git_fetch module on this machine (ad hoc,
// local connection) with env added to a clean environment, and returns its
// combined output.
func runGitFetch(t *testing.T, args map[string]any, env ...string) (string, error) {
	t.Helper()
	a, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("ansible", "localhost", "-i", "localhost,", "-c", "local",
		"-M", filepath.Join(repoRoot(t), "ansible/plugins/modules"),
		"-e", "ansible_python_interpreter=/usr/bin/python3",
		"-m", "autoprov_git_fetch", "-a", string(a))
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "ANSIBLE_LOCAL_TEMP=" + dir,
		"ANSIBLE_NOCOLOR=1", "ANSIBLE_HOST_KEY_CHECKING=0"}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestGitFetchNeverTracesHTTP: git traces its HTTP traffic (request lines,
// headers, TLS details) when GIT_CURL_VERBOSE is set to anything, "0"
// included, and the module's error message quotes git's stderr. The module
// neither sets it nor lets an inherited one (or GIT_TRACE_CURL, or
// GIT_SSL_NO_VERIFY) through: a failing fetch with a token reports no trace,
// and a fetch with the right token works.
func TestGitFetchNeverTracesHTTP(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible", "git")
	const token = "ghp_GitFetchTokenValue0123456789abcdef"
	gs := startGitServer(t, "127.0.0.1", token)
	repo := gs.newRepo(t, "acme/shop.git")
	commit := repo.commit(map[string]string{"compose.yaml": "services: {}\n"})

	hostile := []string{"GIT_CURL_VERBOSE=1", "GIT_TRACE_CURL=1", "GIT_TRACE=1", "GIT_SSL_NO_VERIFY=1"}
	out, err := runGitFetch(t, map[string]any{
		"url": gs.URL + "/acme/shop.git", "branch": "main",
		"git_dir": filepath.Join(t.TempDir(), "repo.git"), "token": "ghp_WrongTokenValue000000000000000000",
	}, hostile...)
	if err == nil || !strings.Contains(out, "git fetch failed") {
		t.Fatalf("fetch with a wrong token did not fail as expected: %v\n%s", err, out)
	}
	for _, trace := range []string{"== Info", "=> Send header", "<= Recv header", "Authorization", "trace: ", "ghp_WrongToken"} {
		if strings.Contains(out, trace) {
			t.Errorf("the module's output holds git's trace or the token (%q):\n%s", trace, out)
		}
	}

	git := filepath.Join(t.TempDir(), "repo.git")
	out, err = runGitFetch(t, map[string]any{"url": gs.URL + "/acme/shop.git", "branch": "main", "git_dir": git, "token": token}, hostile...)
	if err != nil || !strings.Contains(out, commit) {
		t.Fatalf("fetch with the right token: %v\n%s", err, out)
	}
	if strings.Contains(out, token) {
		t.Fatalf("the token is in the module's output:\n%s", out)
	}
	cfg, err := os.ReadFile(filepath.Join(git, "config"))
	if err != nil || strings.Contains(string(cfg), token) {
		t.Fatalf("the token reached .git/config (%v):\n%s", err, cfg)
	}
}
