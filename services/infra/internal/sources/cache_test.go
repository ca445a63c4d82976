package sources

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// newCache is a cache in a fresh directory that lets http through (the
// test server is on loopback) and records git's command lines.
func newCache(t *testing.T, cfg Config) (*Cache, *[][]string) {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(t.TempDir(), "cache")
	}
	cfg.AllowHTTP = true
	c, err := NewCache(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	argvs := &[][]string{}
	c.onExec = func(argv []string) {
		mu.Lock()
		defer mu.Unlock()
		*argvs = append(*argvs, argv)
	}
	return c, argvs
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCheckoutRefs(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok-"+t.Name())
	repo := srv.NewRepo(t, "acme/site.git")
	first := repo.Commit(t, map[string]string{"site.yml": "v1\n", "roles/web/tasks/main.yml": "- debug: {msg: one}\n"})
	repo.Tag(t, "v1.0.0")
	second := repo.Commit(t, map[string]string{"site.yml": "v2\n"})
	repo.Git(t, "branch", "old", first)
	repo.Git(t, "push", "--quiet", filepath.Join(srv.Root, "acme/site.git"), "old")
	c, _ := newCache(t, Config{})

	tests := []struct {
		ref, want, content string
	}{
		{"", second, "v2\n"},
		{"main", second, "v2\n"},
		{"v1.0.0", first, "v1\n"},
		{"old", first, "v1\n"},
		{first, first, "v1\n"},
		{second[:10], second, "v2\n"},
	}
	for _, tt := range tests {
		t.Run("ref="+tt.ref, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "src")
			got, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: tt.ref, Token: srv.Token}, dst)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("commit = %s, want %s", got, tt.want)
			}
			if s := readFile(t, filepath.Join(dst, "site.yml")); s != tt.content {
				t.Errorf("site.yml = %q, want %q", s, tt.content)
			}
			if _, err := os.Stat(filepath.Join(dst, ".git")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("checkout has a .git: %v", err)
			}
		})
	}
	for _, ref := range []string{"nope", "0123456789abcdef", "-oops", "a..b", "--upload-pack=x"} {
		_, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: ref, Token: srv.Token}, filepath.Join(t.TempDir(), "src"))
		if !errors.Is(err, ErrRef) {
			t.Errorf("ref %q: err = %v, want ErrRef", ref, err)
		}
	}
}

// TestCheckoutReuse: the second checkout fetches into the same clone (no
// new clone), and sees a new commit.
func TestCheckoutReuse(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/reuse.git")
	first := repo.Commit(t, map[string]string{"a.yml": "1"})
	c, argvs := newCache(t, Config{})
	checkout := func() string {
		t.Helper()
		got, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: "main", Token: "tok"}, filepath.Join(t.TempDir(), "src"))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	count := func(sub string) int {
		n := 0
		for _, a := range *argvs {
			if strings.Contains(strings.Join(a, " "), sub) {
				n++
			}
		}
		return n
	}
	if got := checkout(); got != first {
		t.Fatalf("first checkout %s, want %s", got, first)
	}
	if count(" init ") != 1 && count("init --quiet --bare") != 1 {
		t.Fatalf("first checkout did not clone: %q", *argvs)
	}
	before := srv.Authorized.Load()
	if got := checkout(); got != first {
		t.Fatalf("second checkout %s, want %s", got, first)
	}
	if count("init --quiet --bare") != 1 || count(" fetch ") != 2 {
		t.Errorf("reuse: want one clone and two fetches, got %q", *argvs)
	}
	if srv.Authorized.Load() == before {
		t.Error("reuse did not ask the server (a job must be authorized by its own token)")
	}
	second := repo.Commit(t, map[string]string{"a.yml": "2"})
	if got := checkout(); got != second {
		t.Errorf("after a push: %s, want %s", got, second)
	}
}

// TestCheckoutCredential: a wrong or missing token fails, even for a commit
// the cache already holds from a job with the right one.
func TestCheckoutCredential(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "right")
	repo := srv.NewRepo(t, "acme/private.git")
	commit := repo.Commit(t, map[string]string{"a.yml": "secret plays"})
	c, _ := newCache(t, Config{})
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: commit, Token: "right"}, filepath.Join(t.TempDir(), "src")); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"", "wrong"} {
		dst := filepath.Join(t.TempDir(), "src")
		_, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: commit, Token: tok}, dst)
		if !errors.Is(err, ErrFetch) {
			t.Errorf("token %q: err = %v, want ErrFetch", tok, err)
		}
		if _, err := os.Stat(filepath.Join(dst, "a.yml")); err == nil {
			t.Errorf("token %q: the cached commit was checked out", tok)
		}
	}
}

// TestCheckoutConcurrent: jobs of one process and of two processes (two
// caches on one directory stand for two replicas) check out one repository
// at once.
func TestCheckoutConcurrent(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/busy.git")
	want := repo.Commit(t, map[string]string{"a.yml": "1", "b/c.yml": "2"})
	dir := filepath.Join(t.TempDir(), "cache")
	c1, _ := newCache(t, Config{CacheDir: dir})
	c2, _ := newCache(t, Config{CacheDir: dir})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		c := c1
		if i%2 == 1 {
			c = c2
		}
		dst := filepath.Join(t.TempDir(), "src")
		wg.Go(func() {
			got, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: "main", Token: "tok"}, dst)
			if err == nil && got != want {
				err = errors.New("commit " + got)
			}
			if err == nil && readFile(t, filepath.Join(dst, "b/c.yml")) != "2" {
				err = errors.New("wrong content")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestCheckoutLockAcrossProcesses: while another process (flock(1)) holds a
// repository's lock, a checkout waits, and gives up at LockTimeout.
func TestCheckoutLockAcrossProcesses(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Fatal("flock(1) is required: ", err)
	}
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/locked.git")
	repo.Commit(t, map[string]string{"a.yml": "1"})
	c, _ := newCache(t, Config{LockTimeout: 300 * time.Millisecond})
	key, err := c.checkRepo(Repo{URL: repo.URL})
	if err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(c.cfg.CacheDir, "locks", key+".lock")
	// flock(1) hands its lock to sleep: stop the two as a group.
	holder := exec.Command(flock, "--exclusive", lock, "sleep", "30")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	release := func() { _ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); _ = holder.Wait() }
	t.Cleanup(release)
	sourcestestWait(t, func() bool { return lockBusy(lock) })
	start := time.Now()
	_, err = c.Checkout(context.Background(), Repo{URL: repo.URL, Token: "tok"}, filepath.Join(t.TempDir(), "src"))
	if !errors.Is(err, errBusy) || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("checkout under another process's lock: err = %v after %v, want busy after the lock timeout", err, time.Since(start))
	}
	release()
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Token: "tok"}, filepath.Join(t.TempDir(), "src")); err != nil {
		t.Fatalf("after the other process let go: %v", err)
	}
}

func lockBusy(path string) bool {
	unlock, err := lockFile(context.Background(), path, false)
	if err != nil {
		return true
	}
	unlock()
	return false
}

func sourcestestWait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTokenNeverStored: the token reaches git through its environment
// only: never in a command line, the cache, the checkout or an error.
func TestTokenNeverStored(t *testing.T) {
	canary := "canary-Zq81xTOKEN"
	srv := sourcestest.NewGitServer(t, canary)
	repo := srv.NewRepo(t, "acme/canary.git")
	repo.Commit(t, map[string]string{"a.yml": "1"})
	c, argvs := newCache(t, Config{})
	dst := filepath.Join(t.TempDir(), "src")
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Token: canary}, dst); err != nil {
		t.Fatal(err)
	}
	// A failing fetch (no such repository) must not echo it either.
	_, ferr := c.Checkout(context.Background(), Repo{URL: srv.URL + "/nope.git", Token: canary}, filepath.Join(t.TempDir(), "src"))
	if ferr == nil {
		t.Fatal("fetch of a missing repository succeeded")
	}
	needles := []string{canary, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + canary))}
	for _, n := range needles {
		for _, a := range *argvs {
			if strings.Contains(strings.Join(a, " "), n) {
				t.Errorf("token in git's command line %q", a)
			}
		}
		if strings.Contains(ferr.Error(), n) {
			t.Errorf("token in error %v", ferr)
		}
	}
	if len(*argvs) == 0 {
		t.Fatal("no git command recorded")
	}
	for _, root := range []string{c.cfg.CacheDir, dst} {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, n := range needles {
				if bytes.Contains(b, []byte(n)) {
					t.Errorf("token in %s", p)
				}
			}
			return nil
		})
	}
	// The environment is where it goes, and nothing else of ours.
	env := strings.Join(c.gitEnv(canary, nil), "\n")
	for _, want := range []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "http.extraHeader", "protocol.allow\nGIT_CONFIG_VALUE_0=never"} {
		if !strings.Contains(env, want) {
			t.Errorf("git env lacks %q:\n%s", want, env)
		}
	}
}

func TestCheckoutURLRefused(t *testing.T) {
	c, err := NewCache(Config{CacheDir: t.TempDir()}, zerolog.Nop()) // no AllowHTTP
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{
		"http://127.0.0.1:1/a.git", "https://user:pw@example.com/a.git", "file:///etc", "ext::sh -c id",
		"ssh://git@example.com/a.git", "git@example.com:a.git", "/srv/repo.git", "https:///x", "-uhttps://example.com/a.git",
	} {
		_, err := c.Checkout(context.Background(), Repo{URL: u}, filepath.Join(t.TempDir(), "src"))
		if !errors.Is(err, ErrURL) {
			t.Errorf("%q: err = %v, want ErrURL", u, err)
		}
	}
}

func TestCheckoutLimits(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/big.git")
	big := strings.Repeat("x", 1<<20) // compresses well: the clone stays small
	repo.Commit(t, map[string]string{"big.txt": big})
	t.Run("checkout", func(t *testing.T) {
		c, _ := newCache(t, Config{CheckoutMax: 512 << 10})
		dst := filepath.Join(t.TempDir(), "src")
		_, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Token: "tok"}, dst)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("err = %v, want ErrTooLarge", err)
		}
		if _, err := os.Stat(filepath.Join(dst, "big.txt")); err == nil {
			t.Error("the file was written anyway")
		}
	})
	t.Run("repository", func(t *testing.T) {
		rnd := srv.NewRepo(t, "acme/random.git")
		rnd.Commit(t, map[string]string{"r.bin": randomText(t, 2<<20)})
		c, _ := newCache(t, Config{RepoMaxBytes: 256 << 10})
		_, err := c.Checkout(context.Background(), Repo{URL: rnd.URL, Token: "tok"}, filepath.Join(t.TempDir(), "src"))
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("err = %v, want ErrTooLarge", err)
		}
		ents, _ := os.ReadDir(filepath.Join(c.cfg.CacheDir, "repos"))
		if len(ents) != 0 {
			t.Errorf("the oversized clone was kept: %v", ents)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		c, _ := newCache(t, Config{Timeout: time.Nanosecond})
		_, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Token: "tok"}, filepath.Join(t.TempDir(), "src"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want a deadline", err)
		}
	})
}

func randomText(t testing.TB, n int) string {
	b := make([]byte, n)
	f, err := os.Open("/dev/urandom")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestCacheEviction: past CacheMaxBytes the least recently used clone
// goes; the one in use stays.
func TestCacheEviction(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	a := srv.NewRepo(t, "acme/a.git")
	a.Commit(t, map[string]string{"a": randomText(t, 200<<10)})
	b := srv.NewRepo(t, "acme/b.git")
	b.Commit(t, map[string]string{"b": randomText(t, 200<<10)})
	c, _ := newCache(t, Config{CacheMaxBytes: 400 << 10})
	keyA, _ := c.checkRepo(Repo{URL: a.URL})
	keyB, _ := c.checkRepo(Repo{URL: b.URL})
	exists := func(key string) bool {
		_, err := os.Stat(filepath.Join(c.cfg.CacheDir, "repos", key+".git"))
		return err == nil
	}
	for _, r := range []*sourcestest.WorkRepo{a, b} {
		if _, err := c.Checkout(context.Background(), Repo{URL: r.URL, Token: "tok"}, filepath.Join(t.TempDir(), "src")); err != nil {
			t.Fatal(err)
		}
	}
	if exists(keyA) || !exists(keyB) {
		t.Errorf("after a, b over the limit: a kept %v (want false), b kept %v (want true)", exists(keyA), exists(keyB))
	}
}

func TestCheckoutSymlinkOut(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/links.git")
	repo.Commit(t, map[string]string{"site.yml": "x", "inner/f": "y"})
	if err := os.Symlink("../inner/f", filepath.Join(repo.Dir, "ok-link")); err != nil {
		t.Fatal(err)
	}
	good := repo.Commit(t, nil)
	c, _ := newCache(t, Config{})
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: good, Token: "tok"}, filepath.Join(t.TempDir(), "src")); !errors.Is(err, ErrPath) {
		t.Fatalf("link climbing out by .. : err = %v, want ErrPath", err)
	}
	repo.Git(t, "rm", "--quiet", "ok-link")
	if err := os.Symlink("inner/f", filepath.Join(repo.Dir, "ok-link")); err != nil {
		t.Fatal(err)
	}
	good = repo.Commit(t, nil)
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: good, Token: "tok"}, filepath.Join(t.TempDir(), "src")); err != nil {
		t.Fatalf("link inside: %v", err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(repo.Dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	bad := repo.Commit(t, nil)
	if _, err := c.Checkout(context.Background(), Repo{URL: repo.URL, Ref: bad, Token: "tok"}, filepath.Join(t.TempDir(), "src")); !errors.Is(err, ErrPath) {
		t.Fatalf("absolute link: err = %v, want ErrPath", err)
	}
}
