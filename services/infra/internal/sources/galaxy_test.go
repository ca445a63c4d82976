package sources

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// helloRole writes its greeting variable to the file out names: a
// template in the greeting must come out as written.
const helloRole = `- name: greet
  ansible.builtin.copy:
    dest: "{{ out }}"
    content: "{{ greeting }}"
    mode: "0600"
`

// tricky is a role variable Ansible would run if it templated it.
const tricky = "{{ lookup('env', 'HOME') }} and {% raw %}"

// runPlay runs ansible-playbook on this machine (connection local) with
// the run's installed collections and roles.
func runPlay(t *testing.T, runDir, play string) {
	t.Helper()
	cmd := exec.Command("ansible-playbook", "-i", "localhost,", "-c", "local", play)
	cmd.Dir = runDir
	cmd.Env = []string{"PATH=" + safePATH, "HOME=" + runDir, "LANG=C.UTF-8", "ANSIBLE_CONFIG=" + filepath.Join(runDir, "galaxy.cfg"),
		"ANSIBLE_COLLECTIONS_PATH=" + filepath.Join(runDir, "collections"), "ANSIBLE_ROLES_PATH=" + filepath.Join(runDir, "roles"),
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(runDir, "tmp"), "PYTHONDONTWRITEBYTECODE=1", "ANSIBLE_NOCOLOR=1"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ansible-playbook: %v\n%s", err, out)
	}
}

func TestGalaxyCollectionRole(t *testing.T) {
	const canary = "galaxy-canary-8Hq2"
	hub := sourcestest.NewGalaxyServer(t, canary)
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "tools", "1.0.0", map[string]string{"roles/hello/tasks/main.yml": helloRole}))
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "tools", "1.1.0", map[string]string{"roles/hello/tasks/main.yml": helloRole}))
	g, err := NewGalaxy(GalaxyConfig{Servers: []string{"public=https://galaxy.invalid/", "hub=" + hub.URL}, AllowHTTP: true}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var argvs []string
	g.onExec = func(argv []string) { argvs = append(argvs, strings.Join(argv, " ")) }
	runDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(runDir, "galaxy.cfg"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	devNull := watchAttrib(t, "/dev/null")
	inst, err := g.InstallCollection(context.Background(), runDir, "", "acme.tools", "<1.1.0", "hub", map[string]string{"hub": canary})
	if err != nil {
		t.Fatal(err)
	}
	// ansible-galaxy creates its token file with mode 0600 when it is no
	// regular file: given /dev/null, as root, it made the host's 0600.
	if devNull() {
		t.Error("ansible-galaxy changed /dev/null's attributes (its token file must be a file of the run's own)")
	}
	manifest, err := os.ReadFile(filepath.Join(inst.CollectionsPath, "ansible_collections/acme/tools/MANIFEST.json"))
	if err != nil || !bytes.Contains(manifest, []byte(`"version": "1.0.0"`)) {
		t.Fatalf("installed collection: %v %.200s", err, manifest)
	}
	out := filepath.Join(runDir, "greeting.txt")
	play := filepath.Join(runDir, "play.yml")
	if err := CollectionRolePlay(play, "acme.tools.hello", map[string]any{"greeting": tricky, "out": out}, PlayOptions{}); err != nil {
		t.Fatal(err)
	}
	runPlay(t, runDir, play)
	if got := readFile(t, out); got != tricky {
		t.Errorf("greeting = %q, want it untemplated %q", got, tricky)
	}
	for _, a := range argvs {
		if strings.Contains(a, canary) {
			t.Errorf("Galaxy token in a command line: %s", a)
		}
	}
	scanFiles(t, runDir, canary)
	if hub.Downloads() != 1 {
		t.Errorf("downloads = %d, want 1", hub.Downloads())
	}
	// Without the token the server refuses: the token did the work.
	if _, err := g.InstallCollection(context.Background(), t.TempDir(), "", "acme.tools", "", "hub", nil); err == nil {
		t.Error("install without the Galaxy token succeeded")
	}
}

// watchAttrib watches path's attributes (inotify IN_ATTRIB: mode, owner,
// times) and returns a function that reports whether they changed since.
func watchAttrib(t *testing.T, path string) func() bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	return func() bool {
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		return err == nil && n > 0
	}
}

// scanFiles fails the test when a file under root holds needle.
func scanFiles(t *testing.T, root, needle string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(needle)) {
				t.Errorf("%q found in %s", needle, p)
			}
		}
		return nil
	})
}

func TestGalaxyRequirementsFile(t *testing.T) {
	hub := sourcestest.NewGalaxyServer(t, "")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "tools", "1.0.0", map[string]string{"roles/hello/tasks/main.yml": helloRole}))
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "more", "2.0.0", map[string]string{"roles/x/tasks/main.yml": "- debug: {msg: x}\n"}))
	g, err := NewGalaxy(GalaxyConfig{Servers: []string{"hub=" + hub.URL}, AllowHTTP: true}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	g.onExec = func([]string) { ran++ }
	write := func(content string) string {
		p := filepath.Join(t.TempDir(), "requirements.yml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	runDir := t.TempDir()
	inst, err := g.Install(context.Background(), runDir, "", write("collections:\n  - acme.tools\n  - name: acme.more\n    source: "+hub.URL+"\n    version: '>=2.0.0'\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"acme/tools", "acme/more"} {
		if _, err := os.Stat(filepath.Join(inst.CollectionsPath, "ansible_collections", c, "MANIFEST.json")); err != nil {
			t.Errorf("%s not installed: %v", c, err)
		}
	}
	ran = 0
	refused := map[string]string{
		"other server":      "collections:\n  - name: acme.tools\n    source: https://galaxy.example.com/api/\n",
		"other server name": "collections:\n  - name: acme.tools\n    source: evil\n",
		"git collection":    "collections:\n  - name: https://example.com/acme/tools.git\n    type: git\n",
		"url collection":    "collections:\n  - name: acme.tools\n    type: url\n",
		"file collection":   "collections:\n  - /tmp/acme-tools-1.0.0.tar.gz\n",
		"git role":          "roles:\n  - src: https://example.com/acme/role.git\n    scm: git\n",
		"git role url only": "roles:\n  - src: git+https://example.com/acme/role.git\n",
		"role include":      "roles:\n  - include: /etc/other.yml\n",
		"old format url":    "- src: https://example.com/role.tar.gz\n",
		"unknown top key":   "collections: []\nextra: 1\n",
		"bad yaml":          "collections: [\n",
	}
	for name, content := range refused {
		_, err := g.Install(context.Background(), t.TempDir(), "", write(content), nil)
		if !errors.Is(err, ErrGalaxy) {
			t.Errorf("%s: err = %v, want ErrGalaxy", name, err)
		}
	}
	if _, err := g.InstallCollection(context.Background(), t.TempDir(), "", "acme.tools", "", "", map[string]string{"evil": "x"}); !errors.Is(err, ErrGalaxy) {
		t.Errorf("token for a server not allowed: err = %v", err)
	}
	if ran != 0 {
		t.Errorf("ansible-galaxy ran %d times for refused requirements", ran)
	}
}

func TestRolePlay(t *testing.T) {
	runDir := t.TempDir()
	src := filepath.Join(runDir, "src")
	if err := os.MkdirAll(filepath.Join(src, "roles/hello/tasks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "roles/hello/tasks/main.yml"), []byte(helloRole), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "galaxy.cfg"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	roleDir, err := SafePath(src, "roles/hello")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(runDir, "greeting.txt")
	play := filepath.Join(runDir, "play.yml")
	vars := map[string]any{"greeting": tricky, "out": out, "nested": map[string]any{"k": []any{1, "{{ x }}"}}}
	if err := RolePlay(play, roleDir, vars, PlayOptions{}); err != nil {
		t.Fatal(err)
	}
	runPlay(t, runDir, play)
	if got := readFile(t, out); got != tricky {
		t.Errorf("greeting = %q, want %q", got, tricky)
	}
	for _, bad := range []struct{ dir, fqcn string }{{"roles/x", ""}, {"/r/{{ x }}", ""}, {"", "acme.tools"}, {"", "Acme.tools.x"}, {"", "a.b.c; rm"}} {
		p := filepath.Join(t.TempDir(), "p.yml")
		var err error
		if bad.fqcn != "" {
			err = CollectionRolePlay(p, bad.fqcn, nil, PlayOptions{})
		} else {
			err = RolePlay(p, bad.dir, nil, PlayOptions{})
		}
		if err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := RolePlay(filepath.Join(t.TempDir(), "p.yml"), roleDir, map[string]any{"bad-name": 1}, PlayOptions{}); err == nil {
		t.Error("a role var with a bad name was accepted")
	}
}

// TestGalaxyCacheOncePerProjectAndSet installs the same requirements for
// several jobs: a project downloads a set once within the cache's time,
// another project (or another set, or an expired entry) downloads again,
// and every run gets the whole set, usable, in its own paths.
func TestGalaxyCacheOncePerProjectAndSet(t *testing.T) {
	hub := sourcestest.NewGalaxyServer(t, "")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "tools", "1.0.0", map[string]string{"roles/hello/tasks/main.yml": helloRole}))
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "more", "2.0.0", map[string]string{"roles/x/tasks/main.yml": "- debug: {msg: x}\n"}))
	cacheDir := filepath.Join(t.TempDir(), "galaxy-cache")
	g, err := NewGalaxy(GalaxyConfig{Servers: []string{"hub=" + hub.URL}, AllowHTTP: true, CacheDir: cacheDir, CacheTTL: time.Hour}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	reqs := filepath.Join(t.TempDir(), "requirements.yml")
	if err := os.WriteFile(reqs, []byte("collections:\n  - acme.tools\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const projectA, projectB = "7d0f3f4e-5b0a-4c7e-9a51-0c8f4a2b1e01", "7d0f3f4e-5b0a-4c7e-9a51-0c8f4a2b1e02"
	manifest := func(inst Installed, c string) bool {
		_, err := os.Stat(filepath.Join(inst.CollectionsPath, "ansible_collections", c, "MANIFEST.json"))
		return err == nil
	}
	steps := []struct {
		name      string
		install   func(runDir string) (Installed, error)
		downloads int // the hub's count after the step
		has, not  []string
	}{
		{"project A, first job", func(d string) (Installed, error) { return g.Install(context.Background(), d, projectA, reqs, nil) },
			1, []string{"acme/tools"}, []string{"acme/more"}},
		{"project A, same set: from the cache", func(d string) (Installed, error) { return g.Install(context.Background(), d, projectA, reqs, nil) },
			1, []string{"acme/tools"}, []string{"acme/more"}},
		{"project A, the same set as a collection_role: another set", func(d string) (Installed, error) {
			return g.InstallCollection(context.Background(), d, projectA, "acme.more", "", "", nil)
		}, 2, []string{"acme/more"}, []string{"acme/tools"}},
		{"project A, that one again: cached too", func(d string) (Installed, error) {
			return g.InstallCollection(context.Background(), d, projectA, "acme.more", "", "", nil)
		}, 2, []string{"acme/more"}, []string{"acme/tools"}},
		{"project B, the same set: never A's install", func(d string) (Installed, error) { return g.Install(context.Background(), d, projectB, reqs, nil) },
			3, []string{"acme/tools"}, []string{"acme/more"}},
		{"no scope: no cache", func(d string) (Installed, error) { return g.Install(context.Background(), d, "", reqs, nil) },
			4, []string{"acme/tools"}, nil},
		{"project A, after the entry expired", func(d string) (Installed, error) {
			old := time.Now().Add(-2 * time.Hour)
			entries, _ := filepath.Glob(filepath.Join(cacheDir, "*", installedMark))
			for _, e := range entries {
				if err := os.Chtimes(e, old, old); err != nil {
					t.Fatal(err)
				}
			}
			return g.Install(context.Background(), d, projectA, reqs, nil)
		}, 5, []string{"acme/tools"}, nil},
	}
	for _, s := range steps {
		runDir := t.TempDir()
		inst, err := s.install(runDir)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := hub.Downloads(); got != s.downloads {
			t.Errorf("%s: the hub served %d downloads in all, want %d", s.name, got, s.downloads)
		}
		for _, c := range s.has {
			if !manifest(inst, c) {
				t.Errorf("%s: %s not in the run's collections", s.name, c)
			}
		}
		for _, c := range s.not {
			if manifest(inst, c) {
				t.Errorf("%s: %s in the run's collections, which did not ask for it", s.name, c)
			}
		}
	}

	// Jobs of one project with the same set at once, on two replicas
	// sharing the cache's directory (two Galaxy instances over it): one
	// download, the others wait for it and copy.
	const projectC = "7d0f3f4e-5b0a-4c7e-9a51-0c8f4a2b1e03"
	other, err := NewGalaxy(GalaxyConfig{Servers: []string{"hub=" + hub.URL}, AllowHTTP: true, CacheDir: cacheDir, CacheTTL: time.Hour}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	before := hub.Downloads()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	insts := make([]Installed, 4)
	for i := range errs {
		replica := []*Galaxy{g, other}[i%2]
		wg.Go(func() { insts[i], errs[i] = replica.Install(context.Background(), t.TempDir(), projectC, reqs, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || !manifest(insts[i], "acme/tools") {
			t.Errorf("concurrent install %d: %v (installed: %v)", i, err, manifest(insts[i], "acme/tools"))
		}
	}
	if got := hub.Downloads() - before; got != 1 {
		t.Errorf("4 jobs at once on two replicas downloaded %d times, want once", got)
	}

	// A run from the cache plays the collection's role.
	runDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(runDir, "galaxy.cfg"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before = hub.Downloads()
	if _, err := g.Install(context.Background(), runDir, projectA, reqs, nil); err != nil {
		t.Fatal(err)
	}
	if hub.Downloads() != before {
		t.Errorf("the last install downloaded again")
	}
	out := filepath.Join(runDir, "greeting.txt")
	play := filepath.Join(runDir, "play.yml")
	if err := CollectionRolePlay(play, "acme.tools.hello", map[string]any{"greeting": "from the cache", "out": out}, PlayOptions{}); err != nil {
		t.Fatal(err)
	}
	runPlay(t, runDir, play)
	if got := readFile(t, out); got != "from the cache" {
		t.Errorf("greeting = %q", got)
	}
	// Entries are the cache's own: nobody else may read them.
	if st, err := os.Stat(cacheDir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("cache directory: %v %v, want 0700", st.Mode(), err)
	}
}
