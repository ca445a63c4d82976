// Package sourcestest serves real git repositories and a Galaxy stand-in
// on loopback for tests of sources, inventories and jobs.
package sourcestest

import (
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// GitServer is git's smart HTTP server (git http-backend behind
// net/http/cgi) on 127.0.0.1 that answers only requests carrying its
// token as HTTP basic authentication (x-access-token:<token>).
type GitServer struct {
	URL        string // http://127.0.0.1:port
	Root       string // directory of the bare repositories
	Token      string
	Authorized atomic.Int32 // requests served
	Refused    atomic.Int32 // requests without the token
}

// NewGitServer starts a server for the test; token empty means no
// authentication.
func NewGitServer(t testing.TB, token string) *GitServer {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	g := &GitServer{Root: t.TempDir(), Token: token}
	backend := &cgi.Handler{
		Path:   filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Root:   "/",
		Env:    []string{"GIT_PROJECT_ROOT=" + g.Root, "GIT_HTTP_EXPORT_ALL=1"},
		Stderr: io.Discard,
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != want {
			g.Refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		g.Authorized.Add(1)
		backend.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	g.URL = "http://" + l.Addr().String()
	return g
}

// WorkRepo is a working repository that pushes to a bare one on a
// GitServer.
type WorkRepo struct {
	URL  string // the repository's URL on the server
	Dir  string // the working tree
	bare string
}

// NewRepo creates the bare repository path (e.g. "acme/site.git") and a
// working repository for it, on branch main.
func (g *GitServer) NewRepo(t testing.TB, path string) *WorkRepo {
	t.Helper()
	r := &WorkRepo{URL: g.URL + "/" + path, Dir: t.TempDir(), bare: filepath.Join(g.Root, path)}
	r.Git(t, "init", "--quiet", "--bare", "--initial-branch=main", r.bare)
	r.Git(t, "init", "--quiet", "--initial-branch=main", r.Dir)
	return r
}

// Commit writes files (path -> content; parents created), removes remove,
// commits everything and pushes main; it returns the commit id.
func (r *WorkRepo) Commit(t testing.TB, files map[string]string, remove ...string) string {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(r.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range remove {
		r.Git(t, "rm", "--quiet", "-r", name)
	}
	r.Git(t, "add", "-A")
	r.Git(t, "commit", "--quiet", "--allow-empty", "-m", "change")
	r.Git(t, "push", "--quiet", r.bare, "main")
	return r.Git(t, "rev-parse", "HEAD")
}

// Tag tags the current commit as name and pushes the tag.
func (r *WorkRepo) Tag(t testing.TB, name string) {
	t.Helper()
	r.Git(t, "tag", "-a", "-m", name, name)
	r.Git(t, "push", "--quiet", r.bare, "refs/tags/"+name)
}

// Git runs git in the working repository and returns its trimmed output.
func (r *WorkRepo) Git(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = r.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.Dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}
