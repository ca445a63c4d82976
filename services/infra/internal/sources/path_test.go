package sources

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSafePath(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"roles/web", "play"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"out":            outside,
		"play/etc":       "/etc",
		"roles/up":       "../..",
		"roles/alias":    "web",
		"dangling":       "missing/x",
		"roles/web/self": "../web",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		rel string
		ok  bool
	}{
		{"site.yml", true},
		{"play/site.yml", true},
		{"roles/web", true},
		{"roles/alias/tasks/main.yml", true},
		{"roles/web/self/tasks", true},
		{"./site.yml", true},
		{"", false},
		{"/etc/passwd", false},
		{"../x", false},
		{"play/../../x", false},
		{"play/../site.yml", false},
		{"out", false},
		{"out/file", false},
		{"play/etc/passwd", false},
		{"roles/up/x", false},
		{"dangling", false},
		{"a\x00b", false},
	}
	for _, tt := range tests {
		got, err := SafePath(root, tt.rel)
		if tt.ok {
			if err != nil {
				t.Errorf("%q: %v", tt.rel, err)
			} else if want, _ := filepath.EvalSymlinks(root); filepath.Dir(got) == "" || !within(want, got) {
				t.Errorf("%q: %s is not under the root", tt.rel, got)
			}
			continue
		}
		if !errors.Is(err, ErrPath) {
			t.Errorf("%q: err = %v, want ErrPath", tt.rel, err)
		}
	}
}
