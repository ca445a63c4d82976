package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// GalaxyServer is a stand-in of the Galaxy v3 API on 127.0.0.1, the part
// `ansible-galaxy collection install` uses: /api/ (available versions),
// /api/v3/collections/<ns>/<name>/, .../versions/, .../versions/<v>/ and
// the artifact download. It serves the tarballs the test adds, and
// requires its token (Authorization: Token <token>) when one is set.
type GalaxyServer struct {
	URL   string // http://127.0.0.1:port/api/ (the server URL for ansible-galaxy)
	Token string

	base      string
	mu        sync.Mutex
	colls     map[string][]galaxyVersion // "ns/name" -> versions
	downloads atomic.Int32
}

type galaxyVersion struct {
	version, file, sha256 string
}

// NewGalaxyServer starts a stand-in for the test.
func NewGalaxyServer(t testing.TB, token string) *GalaxyServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &GalaxyServer{Token: token, base: "http://" + l.Addr().String(), colls: map[string][]galaxyVersion{}}
	g.URL = g.base + "/api/"
	srv := &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return g
}

// Add serves the collection tarball (as BuildCollection writes, named
// <ns>-<name>-<version>.tar.gz).
func (g *GalaxyServer) Add(t testing.TB, tarball string) {
	t.Helper()
	base := strings.TrimSuffix(filepath.Base(tarball), ".tar.gz")
	parts := strings.SplitN(base, "-", 3)
	if len(parts) != 3 {
		t.Fatalf("collection tarball %s: want <ns>-<name>-<version>.tar.gz", tarball)
	}
	b, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	g.mu.Lock()
	defer g.mu.Unlock()
	key := parts[0] + "/" + parts[1]
	g.colls[key] = append(g.colls[key], galaxyVersion{version: parts[2], file: tarball, sha256: hex.EncodeToString(sum[:])})
}

// Downloads counts the artifact downloads served.
func (g *GalaxyServer) Downloads() int { return int(g.downloads.Load()) }

func (g *GalaxyServer) serve(w http.ResponseWriter, r *http.Request) {
	if g.Token != "" && r.Header.Get("Authorization") != "Token "+g.Token {
		http.Error(w, `{"errors":[{"status":"401","detail":"Authentication credentials were not provided."}]}`, http.StatusUnauthorized)
		return
	}
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	path := r.URL.Path
	if path == "/api/" {
		reply(map[string]any{"description": "GALAXY REST API", "current_version": "v3", "available_versions": map[string]string{"v3": "v3/"}})
		return
	}
	if file, ok := strings.CutPrefix(path, "/download/"); ok {
		g.mu.Lock()
		var found string
		for _, vs := range g.colls {
			for _, v := range vs {
				if filepath.Base(v.file) == file {
					found = v.file
				}
			}
		}
		g.mu.Unlock()
		if found == "" {
			http.NotFound(w, r)
			return
		}
		g.downloads.Add(1)
		http.ServeFile(w, r, found)
		return
	}
	rest, ok := strings.CutPrefix(path, "/api/v3/collections/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	seg := strings.Split(strings.Trim(rest, "/"), "/")
	if len(seg) < 2 {
		http.NotFound(w, r)
		return
	}
	ns, name := seg[0], seg[1]
	g.mu.Lock()
	versions := append([]galaxyVersion(nil), g.colls[ns+"/"+name]...)
	g.mu.Unlock()
	if len(versions) == 0 {
		http.Error(w, `{"errors":[{"status":"404","detail":"Not found."}]}`, http.StatusNotFound)
		return
	}
	sort.Slice(versions, func(i, j int) bool { return versions[i].version < versions[j].version })
	href := fmt.Sprintf("/api/v3/collections/%s/%s/", ns, name)
	switch {
	case len(seg) == 2:
		reply(map[string]any{"href": href, "namespace": ns, "name": name,
			"created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
			"highest_version": map[string]string{"version": versions[len(versions)-1].version, "href": href + "versions/" + versions[len(versions)-1].version + "/"}})
	case len(seg) == 3 && seg[2] == "versions":
		var data []map[string]string
		for _, v := range versions {
			data = append(data, map[string]string{"version": v.version, "href": href + "versions/" + v.version + "/"})
		}
		reply(map[string]any{"meta": map[string]int{"count": len(data)},
			"links": map[string]any{"first": href + "versions/", "previous": nil, "next": nil, "last": href + "versions/"}, "data": data})
	case len(seg) == 4 && seg[2] == "versions":
		for _, v := range versions {
			if v.version != seg[3] {
				continue
			}
			reply(map[string]any{
				"href":         href + "versions/" + v.version + "/",
				"namespace":    map[string]string{"name": ns},
				"collection":   map[string]string{"name": name},
				"version":      v.version,
				"download_url": g.base + "/download/" + filepath.Base(v.file),
				"artifact":     map[string]any{"filename": filepath.Base(v.file), "sha256": v.sha256, "size": 0},
				"metadata":     map[string]any{"dependencies": map[string]string{}},
				"signatures":   []any{},
			})
			return
		}
		http.Error(w, `{"errors":[{"status":"404","detail":"Not found."}]}`, http.StatusNotFound)
	default:
		http.NotFound(w, r)
	}
}

// BuildCollection writes a collection namespace.name at version with
// files (path in the collection -> content, e.g.
// "roles/hello/tasks/main.yml") and builds its tarball with
// `ansible-galaxy collection build`; it returns the tarball's path.
func BuildCollection(t testing.TB, namespace, name, version string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	files["galaxy.yml"] = fmt.Sprintf("namespace: %s\nname: %s\nversion: %s\nreadme: README.md\nauthors: [test]\n", namespace, name, version)
	files["README.md"] = "test collection\n"
	for p, content := range files {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	cfg := filepath.Join(dir, "ansible.cfg") // none of this machine's
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ansible-galaxy", "collection", "build", "--output-path", out, src)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8", "ANSIBLE_CONFIG=" + cfg, "PYTHONDONTWRITEBYTECODE=1"}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ansible-galaxy collection build: %v: %s", err, b)
	}
	return filepath.Join(out, fmt.Sprintf("%s-%s-%s.tar.gz", namespace, name, version))
}
