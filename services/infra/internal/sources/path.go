package sources

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// SafePath returns root joined with rel when rel is a relative path that
// stays inside root: not empty, not absolute, no ".." component, and no
// symlink on the way (rel itself included) that resolves outside root or
// does not resolve. The file need not exist; the existing part of the path
// is checked. root itself is resolved first (it may be under a symlink).
// The error wraps ErrPath.
func SafePath(root, rel string) (string, error) {
	if rel == "" || filepath.IsAbs(rel) || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("%w: %q must be a relative path", ErrPath, rel)
	}
	for _, part := range strings.Split(filepath.ToSlash(rel), "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: %q has a parent (..) element", ErrPath, rel)
		}
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("%w: root: %v", ErrPath, err)
	}
	clean := filepath.Clean(rel)
	cur := realRoot
	for _, part := range strings.Split(clean, string(filepath.Separator)) {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			break // missing: nothing further down can be a symlink
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", fmt.Errorf("%w: %q: symlink does not resolve", ErrPath, rel)
			}
			if !within(realRoot, target) {
				return "", fmt.Errorf("%w: %q: symlink points outside", ErrPath, rel)
			}
			next = target
		}
		cur = next
	}
	return filepath.Join(realRoot, clean), nil
}

// within reports whether path is root or under it (both clean).
func within(root, path string) bool {
	r, err := filepath.Rel(root, path)
	return err == nil && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) && !filepath.IsAbs(r)
}

// checkTree refuses a tree holding a symlink whose target is absolute or
// climbs out of root: checked one link at a time, so a chain of links
// stays inside when each does. It runs on every checkout, so that nothing
// a play reads through a path of its repository leaves the checkout.
func checkTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if filepath.IsAbs(target) || !within(root, filepath.Join(filepath.Dir(p), target)) {
			return fmt.Errorf("%w: symlink %s points outside the checkout", ErrPath, rel)
		}
		return nil
	})
}
