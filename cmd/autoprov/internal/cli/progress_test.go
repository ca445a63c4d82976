package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the progress goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestProgressNotATerminal: off a terminal a step that runs long prints one
// plain line on stderr (no spinner, no escape codes), a quick step prints
// nothing, and --json prints nothing at all.
func TestProgressNotATerminal(t *testing.T) {
	t.Parallel()
	var errOut syncBuffer
	g := &globals{ctx: context.Background(), env: Env{Stderr: &errOut}, progressAfter: time.Millisecond}
	done := g.progress("running ansible-lint ansible")
	deadline := time.Now().Add(30 * time.Second)
	for errOut.String() == "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	done()
	done() // twice is harmless
	if got := errOut.String(); got != "autoprov: running ansible-lint ansible ...\n" {
		t.Fatalf("stderr %q, want one plain line", got)
	}

	var quiet syncBuffer
	g = &globals{ctx: context.Background(), env: Env{Stderr: &quiet}, progressAfter: time.Hour}
	g.progress("quick")()
	g = &globals{ctx: context.Background(), env: Env{Stderr: &quiet}, json: true, progressAfter: time.Nanosecond}
	g.progress("json")()
	if quiet.String() != "" {
		t.Fatalf("a quick step or --json printed %q", quiet.String())
	}
	if isTerminal(&errOut) {
		t.Fatal("a buffer is a terminal")
	}
}

// TestValidateShowsProgressOffTerminal: a validate step that runs over the
// threshold (ansible-lint takes seconds to start, even on one playbook)
// leaves plain progress lines on stderr and keeps stdout for the report.
func TestValidateShowsProgressOffTerminal(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	env := map[string]string{"PATH": os.Getenv("PATH")}
	// One small playbook, not the repository's (TestValidate lints those):
	// the lints run beside the other tests.
	dir := filepath.Join(t.TempDir(), "ansible")
	if err := os.MkdirAll(filepath.Join(dir, "playbooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	play := "---\n- name: Ping\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: Ping\n      ansible.builtin.ping:\n"
	if err := os.WriteFile(filepath.Join(dir, "playbooks", "ping.yml"), []byte(play), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("plain", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := run(t, env, "validate", "--bin-dir", bin, "--service", "infra", "--ansible-dir", dir)
		if code != 0 && code != 1 {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		if !strings.Contains(errOut, "autoprov: running ansible-lint") || strings.ContainsAny(errOut, "\r\033") {
			t.Errorf("stderr %q, want plain progress lines", errOut)
		}
		if strings.Contains(out, "autoprov: running") {
			t.Errorf("progress on stdout:\n%s", out)
		}
	})
	t.Run("json", func(t *testing.T) {
		t.Parallel()
		_, errOut, _ := run(t, env, "--json", "validate", "--bin-dir", bin, "--service", "infra", "--ansible-dir", dir)
		if strings.Contains(errOut, "autoprov: running") {
			t.Errorf("--json: progress on stderr %q", errOut)
		}
	})
}
