package runlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Dir keeps each log in a file of a directory, named after the SHA-256 of
// its job id (job ids may hold any printable character, '/' included). A
// truncated log has a ".truncated" marker file next to it.
type Dir struct {
	dir      string
	maxBytes int64
}

var _ Store = (*Dir)(nil)

// NewDir returns a Store in dir (created 0700 when missing) keeping at
// most maxBytes of each log.
func NewDir(dir string, maxBytes int64) (*Dir, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("run logs: directory %q is not absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run logs: %w", err)
	}
	return &Dir{dir: dir, maxBytes: maxBytes}, nil
}

// Backend implements Store.
func (d *Dir) Backend() string { return BackendDir }

func (d *Dir) path(jobID string) string {
	sum := sha256.Sum256([]byte(jobID))
	return filepath.Join(d.dir, hex.EncodeToString(sum[:])+".log")
}

// Put implements Store: the file is written aside and renamed into place,
// so a reader sees the old log or the new one, never half of one.
func (d *Dir) Put(_ context.Context, jobID string, r io.Reader) (Info, error) {
	data, truncated, err := capture(r, d.maxBytes)
	if err != nil {
		return Info{}, err
	}
	path := d.path(jobID)
	tmp, err := os.CreateTemp(d.dir, ".put-*")
	if err != nil {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, bytes.NewReader(data)); err != nil {
		tmp.Close()
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	marker := path + ".truncated"
	if truncated {
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
		}
	} else if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	return Info{JobID: jobID, Size: int64(len(data)), Truncated: truncated, CreatedAt: time.Now()}, nil
}

// Open implements Store.
func (d *Dir) Open(_ context.Context, jobID string) (io.ReadCloser, Info, error) {
	path := d.path(jobID)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	_, merr := os.Stat(path + ".truncated")
	return f, Info{JobID: jobID, Size: st.Size(), Truncated: merr == nil, CreatedAt: st.ModTime()}, nil
}

// Delete implements Store.
func (d *Dir) Delete(_ context.Context, jobID string) error {
	path := d.path(jobID)
	for _, p := range []string{path, path + ".truncated"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete run log of %s: %w", jobID, err)
		}
	}
	return nil
}

// DeleteBefore implements Store, by the files' modification times.
func (d *Dir) DeleteBefore(_ context.Context, t time.Time) (int, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return 0, fmt.Errorf("delete old run logs: %w", err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(t) {
			continue
		}
		path := filepath.Join(d.dir, e.Name())
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("delete old run logs: %w", err)
		}
		_ = os.Remove(path + ".truncated")
		n++
	}
	return n, nil
}
