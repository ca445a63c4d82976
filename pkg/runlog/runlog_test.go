package runlog_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestStores runs one suite against every backend, each on its real
// storage: Postgres, a directory, and an S3 server running as its own
// process.
func TestStores(t *testing.T) {
	backends := map[string]func(t *testing.T, maxBytes int64) runlog.Store{
		"postgres": func(t *testing.T, maxBytes int64) runlog.Store {
			return runlog.NewPostgres(testenv.Pool(t), maxBytes)
		},
		"dir": func(t *testing.T, maxBytes int64) runlog.Store {
			s, err := runlog.NewDir(filepath.Join(t.TempDir(), "logs"), maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"s3": func(t *testing.T, maxBytes int64) runlog.Store {
			srv := testenv.StartS3Server(t, "runlogs")
			s, err := runlog.Open(context.Background(), runlog.Config{
				Backend: runlog.BackendS3, MaxBytes: maxBytes,
				S3: runlog.S3Config{Endpoint: srv.Endpoint(), Bucket: srv.Bucket, Prefix: "runs/",
					AccessKey: "test", PathStyle: true, Timeout: 10 * time.Second},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t, 4096)
			if s.Backend() != name {
				t.Errorf("Backend() = %q, want %q", s.Backend(), name)
			}
			suite(t, s)
		})
	}
}

func suite(t *testing.T, s runlog.Store) {
	ctx := context.Background()
	read := func(jobID string) (string, runlog.Info) {
		t.Helper()
		rc, info, err := s.Open(ctx, jobID)
		if err != nil {
			t.Fatalf("open %s: %v", jobID, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), info
	}

	// Job ids may hold any printable ASCII character.
	jobs := []string{"job-1", "a/../b?c#d%e", strings.Repeat("x", 255)}
	for i, id := range jobs {
		body := strings.Repeat("line "+id+"\n", i+1)
		info, err := s.Put(ctx, id, strings.NewReader(body))
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
		if info.Size != int64(len(body)) || info.Truncated {
			t.Errorf("put %s: info %+v, want size %d, not truncated", id, info, len(body))
		}
		got, ginfo := read(id)
		if got != body {
			t.Errorf("open %s: got %q, want %q", id, got, body)
		}
		if ginfo.Size != int64(len(body)) || ginfo.Truncated || ginfo.CreatedAt.IsZero() {
			t.Errorf("open %s: info %+v", id, ginfo)
		}
	}

	// A later attempt replaces the log.
	if _, err := s.Put(ctx, "job-1", strings.NewReader("second attempt\n")); err != nil {
		t.Fatal(err)
	}
	if got, _ := read("job-1"); got != "second attempt\n" {
		t.Errorf("after replace: %q", got)
	}

	// Longer than the limit (4096): first and last halves with a marker.
	var long bytes.Buffer
	for i := 0; long.Len() < 20000; i++ {
		long.WriteString("output line number ")
		long.WriteString(strings.Repeat("#", i%7))
		long.WriteString("\n")
	}
	long.WriteString("FATAL: the last line\n")
	info, err := s.Put(ctx, "long", bytes.NewReader(long.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	got, ginfo := read("long")
	if !info.Truncated || !ginfo.Truncated {
		t.Errorf("long log not marked truncated: put %+v, open %+v", info, ginfo)
	}
	if !strings.HasPrefix(got, long.String()[:2048]) {
		t.Error("truncated log lost its head")
	}
	if !strings.HasSuffix(got, "FATAL: the last line\n") {
		t.Errorf("truncated log lost its tail: ...%q", got[len(got)-100:])
	}
	if !strings.Contains(got, "bytes of output left out") || int64(len(got)) > 4096+200 {
		t.Errorf("truncated log: %d bytes, marker present %v", len(got), strings.Contains(got, "left out"))
	}

	if _, _, err := s.Open(ctx, "missing"); !errors.Is(err, runlog.ErrNotFound) {
		t.Errorf("open missing: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, jobs[1]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Open(ctx, jobs[1]); !errors.Is(err, runlog.ErrNotFound) {
		t.Errorf("open after delete: %v", err)
	}
	if err := s.Delete(ctx, "missing"); err != nil {
		t.Errorf("delete missing: %v", err)
	}

	// Retention: nothing is older than an hour ago; everything is older
	// than a minute from now.
	if n, err := s.DeleteBefore(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Errorf("DeleteBefore(an hour ago) = %d, %v; want 0", n, err)
	}
	if n, err := s.DeleteBefore(ctx, time.Now().Add(time.Minute)); err != nil || n != 3 {
		t.Errorf("DeleteBefore(in a minute) = %d, %v; want 3 (job-1, the long id, long)", n, err)
	}
	if _, _, err := s.Open(ctx, "long"); !errors.Is(err, runlog.ErrNotFound) {
		t.Errorf("open after retention: %v", err)
	}
}

// TestS3SurvivesRestart stores a log, restarts the S3 server process, and
// reads the log back through the same store.
func TestS3SurvivesRestart(t *testing.T) {
	srv := testenv.StartS3Server(t, "logs")
	ctx := context.Background()
	s, err := runlog.NewS3(ctx, runlog.S3Options{Endpoint: srv.Endpoint(), Bucket: "logs", AccessKey: "k", SecretKey: "s", PathStyle: true, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "job-r", strings.NewReader("kept\n")); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	rc, _, err := s.Open(ctx, "job-r")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "kept\n" {
		t.Errorf("after restart: %q", b)
	}
	if _, err := runlog.NewS3(ctx, runlog.S3Options{Endpoint: srv.Endpoint(), Bucket: "nope", PathStyle: true}); err == nil {
		t.Error("a missing bucket was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	abs := t.TempDir()
	tests := []struct {
		name string
		cfg  runlog.Config
		want string // substring of the error; "" for valid
	}{
		{"postgres", runlog.Config{Backend: "postgres", MaxBytes: 1 << 20}, ""},
		{"dir", runlog.Config{Backend: "dir", Dir: abs, MaxBytes: 1 << 20}, ""},
		{"dir relative", runlog.Config{Backend: "dir", Dir: "logs", MaxBytes: 1 << 20}, "RUNLOG_DIR"},
		{"unknown", runlog.Config{Backend: "ftp", MaxBytes: 1 << 20}, "RUNLOG_BACKEND"},
		{"s3 no endpoint", runlog.Config{Backend: "s3", MaxBytes: 1 << 20, S3: runlog.S3Config{Bucket: "b", Timeout: time.Second}}, "RUNLOG_S3_ENDPOINT"},
		{"s3 creds in url", runlog.Config{Backend: "s3", MaxBytes: 1 << 20, S3: runlog.S3Config{Endpoint: "http://a:b@h", Bucket: "b", Timeout: time.Second}}, "credentials"},
		{"s3 ok", runlog.Config{Backend: "s3", MaxBytes: 1 << 20, S3: runlog.S3Config{Endpoint: "https://s3.example", Bucket: "b", Timeout: time.Second}}, ""},
		{"small max", runlog.Config{Backend: "postgres", MaxBytes: 10}, "RUNLOG_MAX_BYTES"},
		{"negative retention", runlog.Config{Backend: "postgres", MaxBytes: 1 << 20, Retention: -time.Hour}, "RUNLOG_RETENTION"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one naming %s", err, tt.want)
			}
		})
	}
}

func TestDirFilesArePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	s, err := runlog.NewDir(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), "j", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("log directory mode %v, want 0700", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		info, _ := e.Info()
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is readable by others: %v", e.Name(), info.Mode().Perm())
		}
	}
}
