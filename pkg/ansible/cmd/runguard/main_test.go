package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

var guardBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "runguard-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guardBin = filepath.Join(dir, "runguard")
	if err := testenv.GoBuild(guardBin, ".", true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// guarded is a runguard process started the way the infra service starts
// it: its own process group, the event pipe on fd 3, the control socket on
// fd 4.
type guarded struct {
	cmd     *exec.Cmd
	events  *bufio.Reader // what the program wrote to fd 3
	control *os.File      // our end of the control socket
	ctrl    *bufio.Reader
	done    chan struct{}
	seen    []int // pids the program reported, killed when the test ends
}

func startGuard(t *testing.T, script string, flags ...string) *guarded {
	t.Helper()
	evR, evW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
	args := append([]string{"-control-fd=4", "-pass-fd=3"}, flags...)
	args = append(args, "--", "/bin/sh", "-c", script)
	cmd := exec.Command(guardBin, args...)
	cmd.ExtraFiles = []*os.File{evW, theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	evW.Close()
	theirs.Close()
	g := &guarded{cmd: cmd, events: bufio.NewReader(evR), control: ours, ctrl: bufio.NewReader(ours), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		for _, p := range g.seen {
			// Only if it is still the test's own sleep (pids get reused).
			if cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline"); strings.HasPrefix(string(cmd), "sleep\x0030") {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		<-g.done
		evR.Close()
		ours.Close()
	})
	return g
}

func (g *guarded) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		t.Fatal("runguard did not exit")
	}
	return g.cmd.ProcessState.ExitCode()
}

// pids reads n pids the program wrote to fd 3, one per line.
func (g *guarded) pids(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n {
		line, err := g.events.ReadString('\n')
		if err != nil {
			t.Fatalf("read pids: %v", err)
		}
		p, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("bad pid line %q", line)
		}
		out = append(out, p)
		g.seen = append(g.seen, p)
	}
	return out
}

// alive tells whether pid runs (zombies count as gone).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && !strings.HasPrefix(string(b[i+1:]), " Z")
}

func waitGone(t *testing.T, pids []int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, p := range pids {
		for alive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still alive", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -KILL $$", 137},
		{"kill -TERM $$", 143},
	}
	for _, tt := range tests {
		g := startGuard(t, tt.script)
		if got := g.wait(t); got != tt.want {
			t.Errorf("%q: exit %d, want %d", tt.script, got, tt.want)
		}
	}
}

func TestBadProgram(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(guardBin, "--", "/nonexistent/program")
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 127 || !strings.Contains(string(out), "/nonexistent/program") {
		t.Errorf("missing program: %v %s", err, out)
	}
	cmd = exec.Command(guardBin, "--", "relative")
	if _ = cmd.Run(); cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("relative program: exit %d, want 2", cmd.ProcessState.ExitCode())
	}
}

// TestControlAndPassFD checks the status lines and that fd 3 reaches the
// program.
func TestControlAndPassFD(t *testing.T) {
	t.Parallel()
	g := startGuard(t, "echo $$ >&3; exit 7")
	start, err := g.ctrl.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	var t0, t1 int64
	if _, err := fmt.Sscanf(start, "start %d %d %d", &pid, &t0, &t1); err != nil || t1 < t0 {
		t.Fatalf("start line %q: %v", start, err)
	}
	if got := g.pids(t, 1)[0]; got != pid {
		t.Errorf("program wrote pid %d on fd 3, runguard reported %d", got, pid)
	}
	exit, err := g.ctrl.ReadString('\n')
	var t2 int64
	var ws uint32
	if _, err2 := fmt.Sscanf(exit, "exit %d %d", &t2, &ws); err != nil || err2 != nil || t2 < t1 || syscall.WaitStatus(ws).ExitStatus() != 7 {
		t.Fatalf("exit line %q: %v %v", exit, err, err2)
	}
	if got := g.wait(t); got != 7 {
		t.Errorf("exit %d", got)
	}
}

// TestIgnoresTermWhileProgramLives sends SIGTERM to runguard alone: it must
// keep waiting for the program and return its status.
func TestIgnoresTermWhileProgramLives(t *testing.T) {
	t.Parallel()
	g := startGuard(t, "echo go >&3; sleep 1; exit 5")
	if _, err := g.events.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		if err := g.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.wait(t); got != 5 {
		t.Errorf("exit %d, want the program's 5", got)
	}
}

// TestTermToGroupReachesProgram: SIGTERM to the group (as the service
// sends it) ends the program, which sees the default disposition.
func TestTermToGroupReachesProgram(t *testing.T) {
	t.Parallel()
	g := startGuard(t, "echo go >&3; sleep 300")
	if _, err := g.events.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-g.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// sh waits for sleep, which dies by SIGTERM; sh then dies by it too.
	if got := g.wait(t); got != 143 {
		t.Errorf("exit %d, want 143", got)
	}
}

// TestLeftoversKilled: after the program exits, processes it left in the
// group, escaped ones (setsid, like ssh ControlPersist masters) and ones
// ignoring SIGTERM are all gone before runguard exits.
func TestLeftoversKilled(t *testing.T) {
	t.Parallel()
	script := `
sleep 300 & echo $! >&3
setsid sleep 301 & echo $! >&3
(trap '' TERM; exec sleep 302) & echo $! >&3
exit 0`
	g := startGuard(t, script, "-grace=300ms")
	pids := g.pids(t, 3)
	if got := g.wait(t); got != 0 {
		t.Errorf("exit %d", got)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("process %d survived runguard", p)
		}
	}
}

// TestLifeline closes the service's end of the control socket (what the
// kernel does when the service dies, even by SIGKILL): runguard must kill
// the program, its group and escaped processes at once.
func TestLifeline(t *testing.T) {
	t.Parallel()
	script := `
setsid sleep 303 & echo $! >&3
sleep 304 & echo $! >&3
echo $$ >&3
wait`
	g := startGuard(t, script, "-grace=1m")
	pids := g.pids(t, 3)
	// Give setsid a moment to leave the group.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pg, err := unix.Getpgid(pids[0]); err == nil && pg != g.cmd.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("setsid child never left the group")
		}
		time.Sleep(10 * time.Millisecond)
	}
	closed := time.Now()
	g.control.Close()
	g.wait(t)
	waitGone(t, pids, 5*time.Second)
	t.Logf("group and escaped process gone %s after the lifeline closed", time.Since(closed).Round(time.Millisecond))
}

// BenchmarkStartup compares starting /bin/true directly and through
// runguard (fork/exec of runguard, Go runtime start, subreaper setup, the
// /proc scan for leftovers); the difference is runguard's own cost.
func BenchmarkStartup(b *testing.B) {
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"direct", []string{"/bin/true"}},
		{"runguard", []string{guardBin, "--", "/bin/true"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
