package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BuildTags are the build tags of every binary, as GOTAGS in the Makefile
// (why: there): binaries under test are built as `make build` builds them.
const BuildTags = "grpcnotrace"

// BuildBinary builds the main package in dir (e.g. "." for the module a
// test runs in) with `go build` into t.TempDir() and returns the binary's path.
// Under -short it skips the test: building and running binaries is not the
// inner loop's.
func BuildBinary(t testing.TB, dir string) string {
	t.Helper()
	skipShort(t, "a real binary built and run")
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(abs))
	cmd := exec.Command("go", "build", "-tags", BuildTags, "-o", out, ".")
	cmd.Dir = abs
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, b)
	}
	return out
}

// BinaryEnv returns an environment for a binary under test: PATH, HOME and
// TMPDIR from the test process (nothing else leaks in, REDIS_URL and
// DATABASE_URL included), followed by kv ("NAME=value").
func BinaryEnv(kv ...string) []string {
	var env []string
	for _, name := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+v)
		}
	}
	return append(env, kv...)
}

// Process is a binary started by StartBinary. It is killed when the test
// ends if it still runs; its output is kept and shown on failures.
type Process struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdout SafeBuffer
	stderr SafeBuffer
	exited chan struct{}
	err    error // from Wait, once exited is closed
}

// StartBinary starts path with env and args.
func StartBinary(t testing.TB, path string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{t: t, exited: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = env
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", filepath.Base(path), p.Stderr())
		}
	})
	return p
}

// Stdout returns what the process wrote to stdout so far.
func (p *Process) Stdout() string { return p.stdout.String() }

// Stderr returns what the process wrote to stderr so far.
func (p *Process) Stderr() string { return p.stderr.String() }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// status (-1 when a signal killed it). It fails the test on timeout.
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Fatalf("process still running after %s", timeout)
	}
	var exitErr *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exitErr) {
		p.t.Fatalf("wait: %v", p.err)
	}
	return p.cmd.ProcessState.ExitCode()
}

// RunBinary runs path with env and args to completion (at most a minute)
// and returns its stdout, stderr and exit status.
func RunBinary(t testing.TB, path string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := StartBinary(t, path, env, args...)
	code = p.Wait(time.Minute)
	return p.Stdout(), p.Stderr(), code
}

// WaitHTTP polls url until it answers with status want, and returns the
// body. It fails the test when the process exits first or after timeout
// (the process's stderr is logged when a test fails).
func (p *Process) WaitHTTP(url string, want int, timeout time.Duration) string {
	p.t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.After(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == want {
				return string(body)
			}
			last = resp.Status + ": " + strings.TrimSpace(string(body))
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			p.t.Fatalf("process exited (%v) while waiting for %s to answer %d", p.err, url, want)
		case <-deadline:
			p.t.Fatalf("%s did not answer %d within %s (last: %s)", url, want, timeout, last)
		case <-tick.C:
		}
	}
}

// SafeBuffer is a bytes.Buffer that goroutines may write while a test
// reads it: a log sink, or the output of a process.
type SafeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SafeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SafeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// GoBuild builds the main package pkg (relative to the current directory)
// into out; static builds it as a small static binary (CGO_ENABLED=0,
// stripped), as `make build` builds runguard. For TestMain functions, which
// have no testing.TB.
func GoBuild(out, pkg string, static bool) error {
	args := []string{"build", "-trimpath", "-tags", BuildTags, "-o", out}
	env := os.Environ()
	if static {
		args = append(args, "-ldflags=-s -w")
		env = append(env, "CGO_ENABLED=0")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Env = env
	if outp, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, outp)
	}
	return nil
}

// ReflectMethodCallers builds the main package in dir as BuildBinary does
// and returns the functions the linker found calling methods by a name or
// index known only at run time (reflect's Method or MethodByName, as
// text/template does). One such function reachable from main makes the
// linker keep every exported method of every type that reaches an
// interface: the binary and the memory it maps at start more than double.
func ReflectMethodCallers(t testing.TB, dir string) []string {
	t.Helper()
	skipShort(t, "a real binary built")
	cmd := exec.Command("go", "build", "-tags", BuildTags, "-ldflags=-dumpdep", "-o", os.DevNull, ".")
	cmd.Dir = dir
	var deps bytes.Buffer
	cmd.Stderr = &deps
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build -ldflags=-dumpdep %s: %v\n%.2000s", dir, err, deps.String())
	}
	seen := map[string]bool{}
	var out []string
	for line := range strings.Lines(deps.String()) {
		from, _, _ := strings.Cut(line, " -> ")
		if name, ok := strings.CutSuffix(from, " <ReflectMethod>"); ok && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

// RunRoot returns a fresh PLAYBOOK_RUN_ROOT for an infra process under
// test: short (the run directories under it hold unix sockets) and inside a
// directory of the test's own, where infra also keeps what it puts next to
// the run root by default (the fact cache, the Ansible jobs' work dirs, the
// sources cache). All of it is removed when the test ends. The directory
// is searchable by others (0711), as the run root is for a play user.
func RunRoot(tb testing.TB) string {
	tb.Helper()
	base, err := os.MkdirTemp("/tmp", "ap-") // not $TMPDIR: it may be long
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(base, "r")
}
