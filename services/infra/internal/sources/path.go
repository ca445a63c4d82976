package sources

import "errors"

// SafePath returns root joined with rel when rel is a relative path that
// stays inside root: not absolute, no ".." that climbs out, and no
// symlink on the way (rel itself included) that resolves outside root.
// The file need not exist; the existing part of the path is checked. The
// error wraps ErrPath.
func SafePath(root, rel string) (string, error) {
	return "", errors.New("not implemented")
}
