package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// MaxFileSize is the largest file a file: reference may read. Only regular
// files are read: a FIFO, a device, a socket or a directory is refused
// before it is opened.
const MaxFileSize = 1 << 20

// FileBackend resolves file:<path>[#<field>] references to files under one
// root directory, opened through [os.Root]: no path can leave the root,
// whether through ".." or through a symbolic link pointing outside it.
type FileBackend struct {
	root *os.Root
}

// NewFileBackend opens the root directory dir (an absolute path).
func NewFileBackend(dir string) (*FileBackend, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("file backend: root %q is not an absolute path", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("file backend: open root: %w", err)
	}
	return &FileBackend{root: root}, nil
}

// Close closes the root directory.
func (f *FileBackend) Close() error { return f.root.Close() }

// Resolve reads the file. Without a field it returns the whole content
// less one trailing line end ("\n" or "\r\n", see trimOneNewline);
// with one, the file is parsed as a JSON object or, failing that, as dotenv
// lines, and the field's value is returned.
func (f *FileBackend) Resolve(ctx context.Context, ref Ref) (Value, error) {
	v, _, err := f.resolve(ctx, ref)
	return v, err
}

// resolve also returns the parts of the content worth registering with a
// redactor on their own (the values of a structured file).
func (f *FileBackend) resolve(_ context.Context, ref Ref) (Value, [][]byte, error) {
	fail := func(kind error, detail string) (Value, [][]byte, error) {
		return Value{}, nil, &Error{Ref: ref.String(), Kind: kind, Detail: detail}
	}
	if ref.Scheme != SchemeFile {
		return fail(ErrBadRef, "not a file: reference")
	}
	name := filepath.FromSlash(ref.Path)
	// Look before opening: opening a FIFO for reading blocks until a
	// writer comes (for ever, holding the job's slot and the server's
	// lock), and opening a device may have effects of its own.
	st, err := f.root.Stat(name)
	if err != nil {
		return Value{}, nil, openFailure(ref, err)
	}
	if !st.Mode().IsRegular() {
		return fail(ErrBadRef, "not a regular file (refused without opening it)")
	}
	if st.Size() > MaxFileSize {
		return fail(ErrTooLarge, fmt.Sprintf("file of %d bytes, more than the %d a file: reference may read", st.Size(), MaxFileSize))
	}
	// O_NONBLOCK: should the file be swapped for a FIFO between the look
	// and the open, the open returns at once instead of blocking; the
	// check below then refuses it.
	fh, err := f.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return Value{}, nil, openFailure(ref, err)
	}
	defer fh.Close()
	fst, err := fh.Stat()
	if err != nil {
		return fail(ErrUnavailable, "stat failed")
	}
	if !fst.Mode().IsRegular() || !os.SameFile(st, fst) {
		return fail(ErrBadRef, "file replaced while it was being opened")
	}
	content, err := io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
	if err != nil {
		clear(content)
		return fail(ErrUnavailable, "read failed")
	}
	if len(content) > MaxFileSize {
		clear(content)
		return fail(ErrTooLarge, fmt.Sprintf("file larger than %d bytes", MaxFileSize))
	}

	fields, structured := parseFields(content)
	defer clearFields(fields)
	if ref.Field == "" {
		var parts [][]byte
		if structured {
			for _, v := range fields {
				parts = append(parts, []byte(v))
			}
		}
		return NewValue(trimOneNewline(content)), parts, nil
	}
	clear(content)
	if !structured {
		return fail(ErrBadRef, "file is neither a JSON object nor dotenv lines, so it has no fields")
	}
	v, ok := fields[ref.Field]
	if !ok {
		return fail(ErrNotFound, "no such field in the file")
	}
	return ValueFromString(v), nil, nil
}

// trimOneNewline drops exactly one trailing "\n" or "\r\n": the line end
// `echo value > file`, Docker and Kubernetes secret files leave, which no
// URL, token or password means (a Slack webhook URL ending in one fails
// every post with "invalid control character in URL"). Further newlines,
// and every other byte, are the secret's own.
func trimOneNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// openFailure maps an error of os.Root's Stat or Open to our error, with
// a detail that names no value.
func openFailure(ref Ref, err error) *Error {
	e := &Error{Ref: ref.String()}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		e.Kind, e.Detail = ErrNotFound, "no such file under the file root"
	case errors.Is(err, fs.ErrPermission):
		e.Kind, e.Detail = ErrPermission, "file not readable"
	default:
		// os.Root refuses paths that leave the root (through ".." or a
		// symlink) with an unexported error; treat every other failure
		// as a refusal.
		e.Kind, e.Detail = ErrBadRef, "path refused: it leaves the file root or is not a file"
	}
	return e
}

// parseFields parses content as a JSON object or, failing that, as dotenv
// lines, and returns its fields as strings (see kvString).
func parseFields(content []byte) (map[string]string, bool) {
	trimmed := bytes.TrimSpace(content)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.UseNumber()
		var obj map[string]any
		if err := dec.Decode(&obj); err == nil && !dec.More() {
			out := make(map[string]string, len(obj))
			for k, v := range obj {
				s, err := kvString(v)
				if err != nil {
					return nil, false
				}
				out[k] = s
			}
			return out, true
		}
	}
	m, err := ParseDotenv(content)
	if err != nil || len(m) == 0 {
		return nil, false
	}
	return m, true
}

// clearFields drops the parsed fields (strings cannot be zeroed; this only
// lets them be collected sooner).
func clearFields(m map[string]string) { clear(m) }
