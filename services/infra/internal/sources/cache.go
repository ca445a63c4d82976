package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Defaults of Config's zero fields.
const (
	defaultCacheMaxBytes = 4 << 30
	defaultRepoMaxBytes  = 1 << 30
	defaultCheckoutMax   = 1 << 30
	defaultTimeout       = 5 * time.Minute
	defaultLockTimeout   = 10 * time.Minute
)

// Names in the cache directory: locks/<key>.lock (never removed, so that
// every process locks the same inode), repos/<key>.git (the bare clone,
// with usedFile and sizeFile in it), home (git's empty HOME), tmp.
const (
	usedFile = "autoprov-used" // mtime: last use, for LRU eviction
	sizeFile = "autoprov-size" // bytes of the clone after its last fetch
)

// NewCache validates cfg, creates its directory (0700) and returns the
// cache.
func NewCache(cfg Config, log zerolog.Logger, opts ...Option) (*Cache, error) {
	if cfg.CacheDir == "" {
		return nil, errors.New("sources: cache directory is required")
	}
	for _, v := range []struct {
		p   *int64
		def int64
	}{{&cfg.CacheMaxBytes, defaultCacheMaxBytes}, {&cfg.RepoMaxBytes, defaultRepoMaxBytes}, {&cfg.CheckoutMax, defaultCheckoutMax}} {
		if *v.p < 0 {
			return nil, errors.New("sources: size limits must not be negative")
		}
		if *v.p == 0 {
			*v.p = v.def
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = defaultLockTimeout
	}
	dir, err := filepath.Abs(cfg.CacheDir)
	if err != nil {
		return nil, fmt.Errorf("sources: cache directory: %w", err)
	}
	cfg.CacheDir = dir
	for _, d := range []string{dir, filepath.Join(dir, "locks"), filepath.Join(dir, "repos"), filepath.Join(dir, "home"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("sources: cache directory: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sources: cache directory: %w", err)
	}
	c := &Cache{cfg: cfg, log: log, lookup: net.DefaultResolver.LookupNetIP}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// refRe is what a branch, tag or commit may look like here: git's ref
// rules are wider, but a ref must never read as an option or a revision
// expression.
var refRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/+-]*$`)

// hexRe is a commit id, full or abbreviated.
var hexRe = pattern.MustCompile(`^[0-9a-f]{7,}$`, 64)

// checkRepo validates repo's URL and Ref and returns the cache key.
func (c *Cache) checkRepo(repo Repo) (string, error) {
	u, err := url.Parse(repo.URL)
	if err != nil {
		return "", fmt.Errorf("%w: not a URL", ErrURL)
	}
	switch {
	case u.Scheme != "https" && !(u.Scheme == "http" && c.cfg.AllowHTTP):
		return "", fmt.Errorf("%w: scheme must be https", ErrURL)
	case u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("%w: no host", ErrURL)
	case u.User != nil:
		return "", fmt.Errorf("%w: credentials belong in the git credential, not the URL", ErrURL)
	case u.Fragment != "" || strings.ContainsAny(repo.URL, " \t\r\n"):
		return "", fmt.Errorf("%w: fragment or white space", ErrURL)
	}
	if repo.Ref != "" && (!refRe.MatchString(repo.Ref) || strings.Contains(repo.Ref, "..") || strings.HasSuffix(repo.Ref, ".lock") || strings.HasSuffix(repo.Ref, "/")) {
		return "", fmt.Errorf("%w: %q is not a branch, tag or commit", ErrRef, repo.Ref)
	}
	if strings.ContainsAny(repo.Token, "\r\n\x00") {
		return "", fmt.Errorf("%w: token holds a line break", ErrURL)
	}
	sum := sha256.Sum256([]byte(strings.TrimSuffix(repo.URL, "/")))
	return hex.EncodeToString(sum[:16]), nil
}

// Checkout brings repo's cached clone up to date (a clone on first use, a
// fetch on reuse) under the repository's lock, then writes the files of
// the resolved commit into dst (created 0700 when missing; it must be
// empty), without a .git directory. It returns the full commit id.
//
// Every checkout contacts the server with repo's own token, even for a
// commit the cache already holds: a job sees only what its credential can
// read. Errors wrap ErrURL, ErrRef, ErrTooLarge, ErrFetch or the context's
// error.
func (c *Cache) Checkout(ctx context.Context, repo Repo, dst string) (commit string, err error) {
	key, err := c.checkRepo(repo)
	if err != nil {
		return "", err
	}
	if err := emptyDir(dst); err != nil {
		return "", err
	}
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.LockTimeout)
	unlock, err := lockFile(lctx, filepath.Join(c.cfg.CacheDir, "locks", key+".lock"), true)
	cancel()
	if err != nil {
		return "", fmt.Errorf("lock repository cache: %w", err)
	}
	locked := time.Now()
	ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	commit, fetched, err := c.update(ctx, key, repo, dst)
	unlock()
	if err != nil {
		return "", err
	}
	c.log.Debug().Str("commit", commit).Bool("cloned", fetched).
		Dur("lock_wait", locked.Sub(start)).Dur("took", time.Since(locked)).Msg("source checked out")
	c.evict(key)
	return commit, nil
}

// update fetches (cloning when new) and checks out, under the lock.
func (c *Cache) update(ctx context.Context, key string, repo Repo, dst string) (commit string, cloned bool, err error) {
	gitDir := filepath.Join(c.cfg.CacheDir, "repos", key+".git")
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); err != nil {
		if err := os.RemoveAll(gitDir); err != nil {
			return "", false, fmt.Errorf("repository cache: %w", err)
		}
		if _, err := c.run(ctx, "", "", "init", "--quiet", "--bare", gitDir); err != nil {
			return "", false, fmt.Errorf("repository cache: %w", err)
		}
		cloned = true
	}
	// A clone in the cache: while the fetch asks the server, the commit
	// the ref names now is written into a hidden sibling of dst. When the
	// fetch succeeds and the ref has not moved (an unchanged repository,
	// the common case) its files move into dst, which hides the checkout's
	// time behind the fetch's; otherwise it is removed. Nothing of it
	// reaches dst unless the job's own token fetched.
	type guess struct {
		commit, dir string
		err         error
	}
	var guessed chan guess
	if !cloned {
		if prev, err := c.resolve(ctx, gitDir, repo.Ref); err == nil {
			guessed = make(chan guess, 1)
			go func() {
				dir, err := os.MkdirTemp(filepath.Dir(dst), ".checkout-")
				if err == nil {
					err = c.checkout(ctx, gitDir, prev, dir)
				}
				guessed <- guess{prev, dir, err}
			}()
		}
	}
	ferr := c.fetch(ctx, gitDir, repo)
	var g guess
	if guessed != nil {
		g = <-guessed
		defer func() {
			if g.dir != "" {
				_ = os.RemoveAll(g.dir)
			}
		}()
	}
	if ferr != nil {
		if cloned || errors.Is(ferr, ErrTooLarge) {
			_ = os.RemoveAll(gitDir)
		}
		return "", cloned, ferr
	}
	commit, err = c.resolve(ctx, gitDir, repo.Ref)
	if err != nil {
		return "", cloned, err
	}
	if g.err != nil || g.commit != commit || moveEntries(g.dir, dst) != nil {
		if err := c.checkout(ctx, gitDir, commit, dst); err != nil {
			return "", cloned, err
		}
	}
	now := time.Now()
	used := filepath.Join(gitDir, usedFile)
	if err := os.WriteFile(used, nil, 0o600); err == nil {
		_ = os.Chtimes(used, now, now)
	}
	return commit, cloned, nil
}

// moveEntries moves the entries of directory from into the empty
// directory to; on failure to is emptied again.
func moveEntries(from, to string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Rename(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
			left, _ := os.ReadDir(to)
			for _, l := range left {
				_ = os.RemoveAll(filepath.Join(to, l.Name()))
			}
			return err
		}
	}
	return nil
}

// fetch brings every branch and tag of repo (and its HEAD) into gitDir,
// watching the clone's size.
func (c *Cache) fetch(ctx context.Context, gitDir string, repo Repo) error {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if dirSize(gitDir) > c.cfg.RepoMaxBytes {
					cancel(ErrTooLarge)
					return
				}
			}
		}
	}()
	pin, err := c.pin(ctx, repo.URL)
	if err != nil {
		close(done)
		return err
	}
	_, err = c.exec(fctx, gitOpts{token: repo.Token, cfg: pin}, gitDir, "fetch", "--quiet", "--prune", "--no-tags", "--no-write-fetch-head",
		"--end-of-options", repo.URL,
		"+HEAD:refs/autoprov/HEAD", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
	close(done)
	if errors.Is(context.Cause(fctx), ErrTooLarge) {
		return fmt.Errorf("repository: %w (%d bytes)", ErrTooLarge, c.cfg.RepoMaxBytes)
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("fetch repository: %w", ctx.Err())
		}
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	size := dirSize(gitDir)
	if size > c.cfg.RepoMaxBytes {
		return fmt.Errorf("repository: %w (%d bytes)", ErrTooLarge, c.cfg.RepoMaxBytes)
	}
	_ = os.WriteFile(filepath.Join(gitDir, sizeFile), []byte(strconv.FormatInt(size, 10)), 0o600)
	return nil
}

// resolve turns ref into a commit id of gitDir: a branch, then a tag,
// then a commit id; empty is the remote's HEAD.
func (c *Cache) resolve(ctx context.Context, gitDir, ref string) (string, error) {
	var candidates []string
	switch {
	case ref == "":
		candidates = []string{"refs/autoprov/HEAD"}
	default:
		candidates = []string{"refs/heads/" + ref, "refs/tags/" + ref}
		if hexRe.MatchString(ref) {
			candidates = append(candidates, ref)
		}
	}
	for _, cand := range candidates {
		out, err := c.run(ctx, "", gitDir, "rev-parse", "--verify", "--quiet", "--end-of-options", cand+"^{commit}")
		if err == nil {
			if id := strings.TrimSpace(string(out)); hexRe.MatchString(id) {
				return id, nil
			}
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	return "", fmt.Errorf("%w: %q", ErrRef, ref)
}

// checkout writes commit's tree into dst after checking its size.
func (c *Cache) checkout(ctx context.Context, gitDir, commit, dst string) error {
	out, err := c.run(ctx, "", gitDir, "ls-tree", "-r", "-l", "-z", "--end-of-options", commit)
	if err != nil {
		return fmt.Errorf("list commit %s: %w", commit, err)
	}
	var total int64
	for _, entry := range strings.Split(string(out), "\x00") {
		// <mode> SP <type> SP <object> SP+ <size> TAB <path>
		meta, _, ok := strings.Cut(entry, "\t")
		if !ok {
			continue
		}
		f := strings.Fields(meta)
		if len(f) == 4 {
			n, _ := strconv.ParseInt(f[3], 10, 64)
			total += n
		}
	}
	if total > c.cfg.CheckoutMax {
		return fmt.Errorf("checkout of %s: %w (%d bytes, limit %d)", commit, ErrTooLarge, total, c.cfg.CheckoutMax)
	}
	index, err := os.CreateTemp(filepath.Join(c.cfg.CacheDir, "tmp"), "index-")
	if err != nil {
		return fmt.Errorf("checkout: %w", err)
	}
	index.Close()
	os.Remove(index.Name()) // git wants to create it
	defer os.Remove(index.Name())
	if _, err := c.exec(ctx, gitOpts{env: []string{"GIT_INDEX_FILE=" + index.Name()}}, gitDir,
		"--work-tree="+dst, "read-tree", "--reset", "-u", "--end-of-options", commit); err != nil {
		return fmt.Errorf("checkout %s: %w", commit, err)
	}
	return checkTree(dst)
}

// emptyDir creates dst (0700) or checks that it is an empty directory.
func emptyDir(dst string) error {
	if !filepath.IsAbs(dst) {
		return fmt.Errorf("checkout directory %q: must be absolute", dst)
	}
	if err := os.Mkdir(dst, 0o700); err == nil || !errors.Is(err, fs.ErrExist) {
		if err != nil {
			return fmt.Errorf("checkout directory: %w", err)
		}
		return nil
	}
	fi, err := os.Lstat(dst)
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("checkout directory %s: not a directory", dst)
	}
	ents, err := os.ReadDir(dst)
	if err != nil {
		return fmt.Errorf("checkout directory: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("checkout directory %s: not empty", dst)
	}
	return nil
}

// dirSize is the bytes of the files under dir (0 when it is missing).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// evict removes the least recently used clones, other than keep, while the
// cache is over CacheMaxBytes. A clone another job holds is skipped.
func (c *Cache) evict(keep string) {
	reposDir := filepath.Join(c.cfg.CacheDir, "repos")
	ents, err := os.ReadDir(reposDir)
	if err != nil {
		return
	}
	type repo struct {
		key  string
		size int64
		used time.Time
	}
	var repos []repo
	var total int64
	for _, e := range ents {
		key, ok := strings.CutSuffix(e.Name(), ".git")
		if !ok || !e.IsDir() {
			continue
		}
		r := repo{key: key}
		if b, err := os.ReadFile(filepath.Join(reposDir, e.Name(), sizeFile)); err == nil {
			r.size, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		if fi, err := os.Stat(filepath.Join(reposDir, e.Name(), usedFile)); err == nil {
			r.used = fi.ModTime()
		}
		total += r.size
		repos = append(repos, r)
	}
	if total <= c.cfg.CacheMaxBytes {
		return
	}
	sort.Slice(repos, func(i, j int) bool { return repos[i].used.Before(repos[j].used) })
	for _, r := range repos {
		if total <= c.cfg.CacheMaxBytes {
			return
		}
		if r.key == keep {
			continue
		}
		unlock, err := lockFile(context.Background(), filepath.Join(c.cfg.CacheDir, "locks", r.key+".lock"), false)
		if err != nil {
			continue // in use: the next eviction tries again
		}
		err = os.RemoveAll(filepath.Join(reposDir, r.key+".git"))
		unlock()
		if err != nil {
			c.log.Warn().Err(err).Str("repo_key", r.key).Msg("evict cached repository")
			continue
		}
		total -= r.size
		c.log.Info().Str("repo_key", r.key).Int64("bytes", r.size).Msg("evicted cached repository")
	}
}
