package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// installCache keeps what ansible-galaxy installed, per scope (a job's
// project) and requirements set, for ttl: a later job of the same project
// with the same requirements gets a copy and downloads nothing (issue 33).
// A scope is never served another's install: a private collection fetched
// with one project's Galaxy token stays that project's. Version ranges
// are resolved again after ttl. Entries are swapped in whole (a rename),
// so replicas sharing the directory read complete ones; a set is
// installed once at a time, whichever jobs and replicas of the machine
// need it (a file lock per key, see lock).
type installCache struct {
	dir string
	ttl time.Duration
}

// installedMark is the file of a complete entry; its time is the install's.
const installedMark = "installed"

func newInstallCache(dir string, ttl time.Duration) (*installCache, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("galaxy cache: %q is not an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("galaxy cache: %w", err)
	}
	return &installCache{dir: dir, ttl: ttl}, nil
}

// cacheKey is the digest of what decides an install: the scope, the
// allowed servers (name and URL) and the sanitized requirements.
func (g *Galaxy) cacheKey(scope string, cs []collectionReq, rs []roleReq) string {
	b, _ := json.Marshal(struct {
		Scope       string
		Servers     []string
		Collections []collectionReq
		Roles       []roleReq
	}{scope, g.serverList(), cs, rs})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// serverList is the allowed servers as name=url.
func (g *Galaxy) serverList() []string {
	out := make([]string, len(g.servers))
	for i, s := range g.servers {
		out[i] = s.name + "=" + s.url
	}
	return out
}

// lock holds key's lock until the returned function is called, or until
// ctx ends (an error). It is an flock on .lock-<key> in the cache's
// directory, so that two jobs of one replica exclude each other as two
// replicas sharing the directory do. The lock files are kept (empty, one
// per set): removing one while another job opens it would let two hold
// the key.
func (c *installCache) lock(ctx context.Context, key string) (func(), error) {
	unlock, err := lockFile(ctx, filepath.Join(c.dir, ".lock-"+key), true)
	if err != nil {
		return nil, fmt.Errorf("galaxy cache lock: %w", err)
	}
	return unlock, nil
}

// get copies key's entry into inst when it is complete and younger than
// the ttl (true); a failed copy is an error (inst may hold part of it).
func (c *installCache) get(key string, inst Installed) (bool, error) {
	entry := filepath.Join(c.dir, key)
	st, err := os.Stat(filepath.Join(entry, installedMark))
	if err != nil || time.Since(st.ModTime()) > c.ttl {
		return false, nil
	}
	from := Installed{CollectionsPath: filepath.Join(entry, "collections"), RolesPath: filepath.Join(entry, "roles")}
	if err := from.copyInto(inst); err != nil {
		return false, fmt.Errorf("galaxy cache: %w", err)
	}
	return true, nil
}

// copyInto merges in's collections and roles into to's.
func (in Installed) copyInto(to Installed) error {
	if err := copyTree(in.CollectionsPath, to.CollectionsPath); err != nil {
		return err
	}
	return copyTree(in.RolesPath, to.RolesPath)
}

// put stores a copy of inst as key's entry, replacing an older one, and
// removes the entries past the ttl.
func (c *installCache) put(key string, inst Installed) error {
	tmp, err := os.MkdirTemp(c.dir, ".new-"+key[:12]+"-")
	if err != nil {
		return fmt.Errorf("galaxy cache: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename
	to := Installed{CollectionsPath: filepath.Join(tmp, "collections"), RolesPath: filepath.Join(tmp, "roles")}
	if err := inst.copyInto(to); err != nil {
		return fmt.Errorf("galaxy cache: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, installedMark), nil, 0o600); err != nil {
		return fmt.Errorf("galaxy cache: %w", err)
	}
	entry := filepath.Join(c.dir, key)
	if err := os.RemoveAll(entry); err != nil {
		return fmt.Errorf("galaxy cache: %w", err)
	}
	if err := os.Rename(tmp, entry); err != nil {
		return fmt.Errorf("galaxy cache: %w", err)
	}
	c.sweep()
	return nil
}

// sweep removes the entries past the ttl and unfinished ones left by a
// crash (older than an hour).
func (c *installCache) sweep() {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, de := range des {
		p := filepath.Join(c.dir, de.Name())
		switch {
		case strings.HasPrefix(de.Name(), ".new-"):
			if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > time.Hour {
				_ = os.RemoveAll(p)
			}
		case de.IsDir():
			if st, err := os.Stat(filepath.Join(p, installedMark)); err != nil || time.Since(st.ModTime()) > c.ttl {
				_ = os.RemoveAll(p)
			}
		}
	}
}

// copyTree copies the directories, regular files and symbolic links under
// src into dst, keeping their permission bits; what dst holds already is
// kept unless src has the same path, which replaces it. A missing src is
// nothing to copy.
func copyTree(src, dst string) error {
	if _, err := os.Lstat(src); os.IsNotExist(err) {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(p, target, info.Mode().Perm())
		}
		return nil // sockets, devices: nothing ansible-galaxy makes
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
