package secrets

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type fileFixture struct {
	root    string
	outside string
	backend *FileBackend
}

func setupFiles(t *testing.T) fileFixture {
	t.Helper()
	root, outside := t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(root, "plain.txt", canary+"\n")
	write(root, "projects/a/creds.json", `{"api_key": `+mustJSON(canary)+`, "port": 5432, "tls": true, "nested": {"x": 1}}`)
	write(root, "projects/a/app.env", "# comment\nDB_PASSWORD='p@ss word'\nexport API_TOKEN=tok-123456\nURL=\"https://h/$DB_PASSWORD\"\n")
	write(root, "notes.md", "just some text\nwithout fields\n")
	write(root, "lineends/crlf", "https://hooks.example/x\r\n")
	write(root, "lineends/two", "tok\n\n")
	write(root, "lineends/none", "tok")
	write(root, "lineends/cr", "tok\r")
	write(root, "lineends/only", "\n")
	write(root, "big.bin", strings.Repeat("x", MaxFileSize+1))
	write(outside, "secret.txt", "OUTSIDE-SECRET-VALUE")
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(root, "escape-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape-dir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../..", filepath.Join(root, "projects/a/up")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("plain.txt", filepath.Join(root, "inside-link")); err != nil {
		t.Fatal(err)
	}
	b, err := NewFileBackend(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return fileFixture{root: root, outside: outside, backend: b}
}

func TestFileBackend(t *testing.T) {
	t.Parallel()
	f := setupFiles(t)
	cases := []struct {
		ref  string
		want string
		kind error
	}{
		// Exactly one trailing line end is dropped (echo, Docker and
		// Kubernetes secret files).
		{ref: "file:plain.txt", want: canary},
		{ref: "file:lineends/crlf", want: "https://hooks.example/x"},
		{ref: "file:lineends/two", want: "tok\n"},
		{ref: "file:lineends/none", want: "tok"},
		{ref: "file:lineends/cr", want: "tok\r"},
		{ref: "file:lineends/only", want: ""},
		{ref: "file:notes.md", want: "just some text\nwithout fields"},
		{ref: "file:projects/a/creds.json#api_key", want: canary},
		{ref: "file:projects/a/creds.json#port", want: "5432"},
		{ref: "file:projects/a/creds.json#tls", want: "true"},
		{ref: "file:projects/a/creds.json#nested", want: `{"x":1}`},
		{ref: "file:projects/a/app.env#DB_PASSWORD", want: "p@ss word"},
		{ref: "file:projects/a/app.env#API_TOKEN", want: "tok-123456"},
		{ref: "file:projects/a/app.env#URL", want: "https://h/p@ss word"},
		{ref: "file:inside-link", want: canary},
		{ref: "file:projects/a/creds.json#missing", kind: ErrNotFound},
		{ref: "file:missing.txt", kind: ErrNotFound},
		{ref: "file:notes.md#x", kind: ErrBadRef},
		{ref: "file:projects", kind: ErrBadRef},
		{ref: "file:big.bin", kind: ErrTooLarge},
		{ref: "file:escape-link", kind: ErrBadRef},
		{ref: "file:escape-dir/secret.txt", kind: ErrBadRef},
		{ref: "file:projects/a/up/escape-dir/secret.txt", kind: ErrBadRef},
	}
	for _, tc := range cases {
		t.Run(tc.ref, func(t *testing.T) {
			ref, err := ParseRef(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			v, err := f.backend.Resolve(context.Background(), ref)
			if tc.kind != nil {
				if !errors.Is(err, tc.kind) {
					t.Fatalf("error %v, want kind %v", err, tc.kind)
				}
				if strings.Contains(err.Error(), "OUTSIDE-SECRET") || strings.Contains(err.Error(), "Kanar1e") {
					t.Errorf("error holds a value: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Reveal() != tc.want {
				t.Errorf("got %q, want %q", v.Reveal(), tc.want)
			}
		})
	}
}

// Paths that ParseRef refuses must be refused by the backend as well, in
// case a Ref is built by hand.
func TestFileBackendRefusesDotDotEvenWithoutParseRef(t *testing.T) {
	t.Parallel()
	f := setupFiles(t)
	rel, err := filepath.Rel(f.root, filepath.Join(f.outside, "secret.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{rel, "projects/../../" + filepath.Base(f.outside) + "/secret.txt", f.outside + "/secret.txt"} {
		v, err := f.backend.Resolve(context.Background(), Ref{Scheme: SchemeFile, Path: p})
		if err == nil || !v.IsZero() {
			t.Errorf("%q: read outside the root", p)
		}
	}
}

func TestFileBackendNeedsAbsoluteRoot(t *testing.T) {
	t.Parallel()
	if _, err := NewFileBackend("relative/dir"); err == nil {
		t.Error("relative root accepted")
	}
	if _, err := NewFileBackend(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing root accepted")
	}
}

// TestFileBackendRefusesNonRegularFilesBeforeOpening: a FIFO (which would
// block the open for ever), a device, a socket and a directory, also
// behind a symlink inside the root, are refused at once and never opened.
func TestFileBackendRefusesNonRegularFilesBeforeOpening(t *testing.T) {
	f := setupFiles(t)
	fifo := filepath.Join(f.root, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("fifo", filepath.Join(f.root, "fifo-link")); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(f.root, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	refs := []string{"file:fifo", "file:fifo-link", "file:fifo#field", "file:sock", "file:projects/a"}
	if os.Geteuid() == 0 { // a character device like /dev/zero, made inside the root
		if err := syscall.Mknod(filepath.Join(f.root, "zero"), syscall.S_IFCHR|0o600, 1<<8|5 /* makedev(1, 5) */); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, "file:zero")
	}
	for _, r := range refs {
		ref, err := ParseRef(r)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.backend.Resolve(context.Background(), ref)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrBadRef) || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("%s: err = %v, want a refusal of a non-regular file", r, err)
			}
		case <-time.After(10 * time.Second):
			// Unblock the stuck open so the test can end.
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			t.Fatalf("%s: Resolve blocked: the file was opened", r)
		}
	}
}

// TestFileTooLarge: a file over MaxFileSize fails with ErrTooLarge, and a
// resolver with MaxValueSize refuses (and wipes) a larger value.
func TestFileTooLarge(t *testing.T) {
	t.Parallel()
	f := setupFiles(t)
	ref, _ := ParseRef("file:big.bin")
	if _, err := f.backend.Resolve(context.Background(), ref); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big file: err = %v, want ErrTooLarge", err)
	}
	red := NewRedactor()
	res, err := NewResolver(ResolverOptions{File: f.backend, Redactor: red, MaxValueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	_, err = res.Resolve(context.Background(), "file:plain.txt")
	if !errors.Is(err, ErrTooLarge) || IsBadRef(err) || IsUnavailable(err) {
		t.Fatalf("value over MaxValueSize: err = %v, want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "more than the 16 allowed") || strings.Contains(err.Error(), "Kanar1e") {
		t.Fatalf("error text: %v", err)
	}
	if red.Len() != 0 {
		t.Fatal("a refused value was registered (and kept) with the redactor")
	}
	if v, err := res.Resolve(context.Background(), "file:projects/a/app.env#API_TOKEN"); err != nil || v.Reveal() != "tok-123456" {
		t.Fatalf("small value: %v %v", v.Reveal(), err)
	}
}
