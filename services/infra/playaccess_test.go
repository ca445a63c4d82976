package main

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestPlayUserCannotReadPlaybookDir starts the real binary with
// PLAYBOOK_DIR under a private (0700) directory the play user cannot
// enter, as a clone under /root is: infra refuses to start, naming
// PLAYBOOK_DIR, the directory in the way and the fix, instead of failing
// every play later with "the playbook ... could not be found". Once the
// directory is opened (o+x), the same settings are valid.
func TestPlayUserCannotReadPlaybookDir(t *testing.T) {
	playUser := ""
	for _, name := range []string{"autoprov-play", "nobody"} {
		if u, err := user.Lookup(name); err == nil && u.Uid != "0" && u.Uid != os.Getenv("UID") {
			playUser = name
			break
		}
	}
	if playUser == "" {
		t.Fatal("no unprivileged user (autoprov-play, nobody) to run plays as (make test creates autoprov-play)")
	}
	tmp := t.TempDir()
	// t.TempDir makes its directories 0700: open them, as /tmp is.
	for d := tmp; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	private := filepath.Join(tmp, "home")
	dir := filepath.Join(private, "clone", "ansible")
	if err := os.MkdirAll(filepath.Join(dir, "playbooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	// Every directory above the private one must be open, or the refusal
	// names another one.
	for d := filepath.Dir(private); d != "/"; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o001 == 0 {
			t.Fatalf("%s is not searchable by others: the test needs an open temporary directory (set TMPDIR)", d)
		}
	}
	bin := testenv.BuildBinary(t, ".")
	env := testenv.BinaryEnv(
		"REDIS_URL="+os.Getenv("REDIS_URL"), "DATABASE_URL="+os.Getenv("DATABASE_URL"),
		"PLAYBOOK_DIR="+dir, "PLAYBOOK_USER="+playUser, "PLAYBOOK_RUN_ROOT="+testenv.RunRoot(t),
	)
	_, stderr, code := testenv.RunBinary(t, bin, env)
	if code != 2 {
		t.Fatalf("exit %d, want 2 (a configuration error); stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"PLAYBOOK_DIR", playUser, private + " is mode 0700", "chmod o+x " + private} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}

	if err := os.Chmod(private, 0o711); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := testenv.RunBinary(t, bin, env, "--check-config")
	if code != 0 || strings.Contains(stderr, "PLAYBOOK_DIR") {
		t.Fatalf("with %s open: exit %d; stdout:\n%s\nstderr:\n%s", private, code, stdout, stderr)
	}
}
