package harden

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain doubles as the program under test: with HARDEN_TEST_CHILD set,
// the test binary scrubs its environment (and, with HARDEN_TEST_NODUMPS,
// makes itself non-dumpable), reports what it sees on stdout, and waits
// for its stdin to close.
func TestMain(m *testing.M) {
	if os.Getenv("HARDEN_TEST_CHILD") != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

type report struct {
	Pid      int               `json:"pid"`
	Args     []string          `json:"args"`
	Getenv   map[string]string `json:"getenv"`
	Environ  string            `json:"environ"` // /proc/self/environ as the kernel shows it
	Dumpable bool              `json:"dumpable"`
	CoreMax  uint64            `json:"core_max"`
	Err      string            `json:"err,omitempty"`
}

func child() int {
	r := report{Pid: os.Getpid(), Args: os.Args[1:], Getenv: map[string]string{}}
	seen := ""
	if os.Getenv("HARDEN_TEST_LATE") != "" {
		// As service.Main: Restore first, the configuration loaded (its
		// "unset" option removes the token from Go's environment), then
		// ScrubEnv.
		if err := Restore(); err != nil {
			r.Err = err.Error()
		}
		seen = os.Getenv("SECRET_TOKEN")
		_ = os.Unsetenv("SECRET_TOKEN")
	}
	if err := ScrubEnv(Names([]string{"SECRET_TOKEN"}, "DB_")); err != nil {
		r.Err = err.Error()
	}
	if os.Getenv("HARDEN_TEST_NODUMPS") != "" {
		if err := NoDumps(); err != nil {
			r.Err = err.Error()
		}
	}
	for _, k := range []string{"SECRET_TOKEN", "DB_PASSWORD", "KEEP", envFDVar} {
		r.Getenv[k] = os.Getenv(k)
	}
	if seen != "" {
		r.Getenv["SECRET_TOKEN"] = seen
	}
	b, _ := os.ReadFile("/proc/self/environ")
	r.Environ = string(b)
	r.Dumpable, _ = Dumpable()
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_CORE, &lim)
	r.CoreMax = lim.Max
	_ = json.NewEncoder(os.Stdout).Encode(r)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the test closes stdin
	return 0
}

// startChild starts the test binary as the program, as uid when uid >= 0,
// and returns its report and a function that ends it.
func startChild(t *testing.T, uid int, env ...string) (report, func()) {
	t.Helper()
	bin := os.Args[0]
	if uid >= 0 {
		bin = exposedCopy(t, bin)
	}
	cmd := exec.Command(bin, "-test.run=^$", "extra-arg")
	cmd.Env = append([]string{"HARDEN_TEST_CHILD=1", "PATH=/usr/bin:/bin"}, env...)
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		stdin.Close()
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	var r report
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		t.Fatalf("child report: %v", err)
	}
	if r.Err != "" {
		t.Fatalf("child: %s", r.Err)
	}
	return r, stop
}

// exposedCopy copies the test binary where another user may run it.
func exposedCopy(t *testing.T, bin string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "harden-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dst := dir + "/harden.test"
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestScrubEnvRemovesSecretsFromProcEnviron: after ScrubEnv the secrets
// are gone from /proc/<pid>/environ, as the process itself and another
// process read it, while the program still reads them with os.Getenv; the
// arguments and other variables are kept. Without ScrubEnv,
// os.Unsetenv would leave them in that block.
func TestScrubEnvRemovesSecretsFromProcEnviron(t *testing.T) {
	const token, pw = "s3cr3t-token-value-0001", "db-password-value-0002"
	r, _ := startChild(t, -1, "SECRET_TOKEN="+token, "DB_PASSWORD="+pw, "KEEP=kept")
	if r.Getenv["SECRET_TOKEN"] != token || r.Getenv["DB_PASSWORD"] != pw || r.Getenv["KEEP"] != "kept" || r.Getenv[envFDVar] != "" {
		t.Fatalf("the program does not see its environment: %v", r.Getenv)
	}
	if len(r.Args) != 2 || r.Args[1] != "extra-arg" {
		t.Fatalf("arguments after the re-exec: %v", r.Args)
	}
	outside, err := os.ReadFile("/proc/" + strconv.Itoa(r.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []string{r.Environ, string(outside)} {
		if strings.Contains(block, token) || strings.Contains(block, pw) {
			t.Fatalf("a secret is still in /proc/<pid>/environ: %q", block)
		}
		if !strings.Contains(block, "KEEP=kept") {
			t.Fatalf("other variables lost: %q", block)
		}
	}
	// Nothing to scrub: no re-exec, the environment is as it was.
	r2, _ := startChild(t, -1, "KEEP=kept")
	if !strings.Contains(r2.Environ, "KEEP=kept") || strings.Contains(r2.Environ, envFDVar) {
		t.Fatalf("clean start: %q", r2.Environ)
	}
}

// TestScrubEnvAfterConfiguration: called after the program loaded its
// configuration and removed a secret from its own environment (as
// service.Main does), ScrubEnv still takes it out of the kernel's block,
// the new image reads it back before its configuration is loaded, and it
// re-executes once only (a second ScrubEnv in the new image finds nothing
// to scrub).
func TestScrubEnvAfterConfiguration(t *testing.T) {
	const token, pw = "s3cr3t-token-value-0003", "db-password-value-0004"
	r, _ := startChild(t, -1, "HARDEN_TEST_LATE=1", "SECRET_TOKEN="+token, "DB_PASSWORD="+pw, "KEEP=kept")
	if r.Getenv["SECRET_TOKEN"] != token || r.Getenv["DB_PASSWORD"] != pw || r.Getenv["KEEP"] != "kept" || r.Getenv[envFDVar] != "" {
		t.Fatalf("the program does not see its environment: %v", r.Getenv)
	}
	outside, err := os.ReadFile("/proc/" + strconv.Itoa(r.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(outside), token) || strings.Contains(string(outside), pw) || !strings.Contains(string(outside), "KEEP=kept") {
		t.Fatalf("environment block after the scrub: %q", outside)
	}
}

// TestNoDumpsHidesProcFromSameUser: a process of the same (unprivileged)
// user, like a play, cannot read a non-dumpable process's environ or
// memory, and the core limit is 0; without NoDumps it can read them.
func TestNoDumpsHidesProcFromSameUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs processes as another user and needs root (make test runs as root)")
	}
	const nobody = 65534
	read := func(pid int, file string) error {
		cmd := exec.Command("/bin/cat", "/proc/"+strconv.Itoa(pid)+"/"+file)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		return cmd.Run()
	}
	open, _ := startChild(t, nobody, "KEEP=kept")
	if err := read(open.Pid, "environ"); err != nil {
		t.Fatalf("control: a dumpable process's environ is not readable by its own user (%v): the test proves nothing", err)
	}
	closed, _ := startChild(t, nobody, "KEEP=kept", "HARDEN_TEST_NODUMPS=1")
	if closed.Dumpable || closed.CoreMax != 0 {
		t.Fatalf("after NoDumps: dumpable %v, core limit %d", closed.Dumpable, closed.CoreMax)
	}
	for _, file := range []string{"environ", "mem"} {
		if err := read(closed.Pid, file); err == nil {
			t.Errorf("/proc/<pid>/%s of a non-dumpable process was read by its own user", file)
		}
	}
}
