package testenv

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Build is one binary of a Builds set: Pkg (a main package, relative to
// the test's directory or an import path) built into Name, static as
// GoBuild's static.
type Build struct {
	Name, Pkg string
	Static    bool
}

// Builds is a set of binaries built once per test process, on the first
// Dir call, into one temporary directory (a binary finds its helpers next
// to it, as infra finds runguard). Tests in parallel share it; TestMain
// calls Close after m.Run so that a test process leaves nothing behind.
type Builds struct {
	prefix string
	builds []Build
	once   sync.Once
	dir    string // set by once
	err    error  // set by once
}

// NewBuilds returns the set of builds, named prefix* in the temp dir.
func NewBuilds(prefix string, builds ...Build) *Builds {
	return &Builds{prefix: prefix, builds: builds}
}

// Dir builds the set (once) and returns its directory. Under -short it
// skips the test, as BuildBinary does.
func (b *Builds) Dir(t testing.TB) string {
	t.Helper()
	skipShort(t, "real binaries built and run")
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", b.prefix); b.err != nil {
			return
		}
		for _, x := range b.builds {
			if b.err = GoBuild(filepath.Join(b.dir, x.Name), x.Pkg, x.Static); b.err != nil {
				return
			}
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// Path builds the set (once) and returns the path of its binary name.
func (b *Builds) Path(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(b.Dir(t), name)
}

// Close removes the directory of the builds, if any was made. Call it
// after m.Run, when no test calls Dir any more.
func (b *Builds) Close() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
