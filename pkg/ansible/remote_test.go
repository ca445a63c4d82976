package ansible

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
)

func TestRemoteMarker(t *testing.T) {
	t.Parallel()
	h := Host{Alias: "web-1", Address: "192.0.2.10", Port: 22, User: "root"}
	key := pinnedKey{line: "ssh-ed25519 AAAA"}
	a, b := newRemoteMarker(h, key), newRemoteMarker(h, key)
	if a.scope != b.scope || a.run == b.run {
		t.Fatalf("markers %s and %s: want one scope per target and a new run each time", a, b)
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}\.[0-9a-f]{16}$`).MatchString(a.String()) {
		t.Fatalf("marker %q: want <16 hex>.<16 hex> (it is part of a remote shell command)", a)
	}
	for name, other := range map[string]Host{
		"alias":   {Alias: "web-2", Address: h.Address, Port: 22, User: "root"},
		"address": {Alias: h.Alias, Address: "192.0.2.11", Port: 22, User: "root"},
		"port":    {Alias: h.Alias, Address: h.Address, Port: 2222, User: "root"},
	} {
		if newRemoteMarker(other, key).scope == a.scope {
			t.Errorf("another %s, same scope", name)
		}
	}
	if newRemoteMarker(h, pinnedKey{line: "ssh-ed25519 BBBB"}).scope == a.scope {
		t.Errorf("another host key, same scope")
	}
	// The login user does not change the scope: a deploy and a provisioning
	// run of one server see each other.
	if u := (Host{Alias: h.Alias, Address: h.Address, Port: 22, User: "deploy"}); newRemoteMarker(u, key).scope != a.scope {
		t.Errorf("another user, another scope")
	}
	if got, want := a.interpreter(), "/usr/bin/env AUTOPROV_RUN="+a.String()+" python3"; got != want {
		t.Errorf("interpreter = %q, want %q", got, want)
	}
	cmd := reapCommand(reapTakeover, a, 2500*time.Millisecond)
	if !strings.Contains(cmd, "sudo -n python3 - takeover "+a.String()+" 2.500") || !strings.Contains(cmd, "exec python3 - takeover") {
		t.Errorf("reap command = %q", cmd)
	}
}

func TestParseReapOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, out string
		want      *RemoteReport
		err       string
	}{
		{"report", `{"stopped": 3, "killed": 1, "left": 0, "left_pids": [], "runs": ["ab"], "dirs": 2, "privileged": true}`,
			&RemoteReport{Stopped: 3, Killed: 1, Runs: []string{"ab"}, Dirs: 2, Privileged: true}, ""},
		{"after a banner", "Welcome!\n{not json\n" + `{"stopped": 0, "left": 0, "runs": [], "privileged": false}` + "\n",
			&RemoteReport{Runs: []string{}}, ""},
		{"left", `{"stopped": 2, "killed": 2, "left": 1, "runs": ["x"], "privileged": true}`,
			&RemoteReport{Stopped: 2, Killed: 2, Left: 1, Runs: []string{"x"}, Privileged: true}, ""},
		{"script error", `{"error": "usage"}`, nil, "reap: usage"},
		{"nothing", "", nil, "no report"},
		{"broken", "{\"stopped\": ", nil, "unreadable report"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseReapOutput([]byte(tt.out))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Stopped != tt.want.Stopped || got.Killed != tt.want.Killed || got.Left != tt.want.Left || got.Dirs != tt.want.Dirs ||
				got.Privileged != tt.want.Privileged || strings.Join(got.Runs, ",") != strings.Join(tt.want.Runs, ",") {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// fakeProc is a process standing in for remote work on the target (this
// machine).
type fakeProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startFake starts argv with AUTOPROV_RUN=marker (none when empty) in a
// session of its own (as sshd starts a channel's command), with stdin as
// its standard input.
func startFake(t *testing.T, marker, stdin string, argv ...string) *fakeProc {
	t.Helper()
	if marker != "" {
		argv = append([]string{"/usr/bin/env", markerEnv + "=" + marker}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + safePath}
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &fakeProc{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

func (p *fakeProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// childOf waits for a live child of pid and returns it.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		found := 0
		proc.Each(func(p int) {
			if st, err := proc.ReadStat(p); err == nil && st.PPid == pid && st.Live() {
				found = p
			}
		})
		if found != 0 {
			return found
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no child of %d", pid)
	return 0
}

func pidAlive(pid int) bool {
	st, err := proc.ReadStat(pid)
	return err == nil && st.Live()
}

// TestReapScript runs reap.py on this machine (as the target) against
// processes standing in for the remote work of runs: the tasks of earlier
// runs of the scope are stopped with their children (a TERM-deaf one by
// SIGKILL), and nothing else is touched: the run's own task, another
// server's, a daemon a finished task left, an unmarked process.
func TestReapScript(t *testing.T) {
	t.Parallel()
	const scope, other = "00000000000000aa", "00000000000000bb"
	py := "/usr/bin/python3"
	withChild := "import subprocess\nsubprocess.call(['sleep', '300'])\n"
	deaf := "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)\n"
	sleeper := "import time\ntime.sleep(300)\n"

	earlier := startFake(t, scope+".r1", withChild, py)     // a task of an earlier run, with a `sleep` child
	deafTask := startFake(t, scope+".r2", deaf, py)         // one that ignores SIGTERM
	ownTask := startFake(t, scope+".r0", sleeper, py)       // the run's own (cleanup mode)
	otherServer := startFake(t, other+".r1", sleeper, py)   // another server's run
	daemon := startFake(t, scope+".r1", "", "sleep", "300") // left on purpose by a finished task: not a module
	unmarked := startFake(t, "", sleeper, py)               // nothing of ours
	sleepChild := childOf(t, earlier.cmd.Process.Pid)       // env execs python3, which forks sleep
	home := t.TempDir()
	tmpDir := func(name string) string { return filepath.Join(home, ".ansible", "tmp", name) }
	// The scope's tmp dir with what an earlier run left in it, a per-run
	// dir of an earlier version, another server's dir.
	for _, name := range []string{"autoprov-" + scope, "autoprov-" + scope + ".r1", "autoprov-" + other} {
		if err := os.MkdirAll(filepath.Join(tmpDir(name), "ansible-tmp-1-2-3"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Every stand-in has exec'd what it runs (env is gone).
	for _, p := range []*fakeProc{earlier, deafTask, ownTask, otherServer, daemon, unmarked} {
		waitExec(t, p.cmd.Process.Pid)
	}

	run := func(mode, marker string) *RemoteReport {
		t.Helper()
		cmd := exec.Command(py, "-", mode, marker, "1")
		cmd.Stdin = bytes.NewReader(reapScript)
		cmd.Env = []string{"PATH=" + safePath, "HOME=" + home, "USER=nobody-such"}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("reap.py %s: %v\n%s", mode, err, out)
		}
		rep, err := parseReapOutput(out)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", mode, bytes.TrimSpace(out))
		return rep
	}

	rep := run("takeover", scope+".r0")
	for name, p := range map[string]*fakeProc{"earlier task": earlier, "TERM-deaf task": deafTask} {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s still alive after the takeover", name)
		}
	}
	if pidAlive(sleepChild) {
		t.Errorf("the earlier task's sleep child %d still alive", sleepChild)
	}
	for name, p := range map[string]*fakeProc{"own task": ownTask, "other server's task": otherServer, "daemon": daemon, "unmarked": unmarked} {
		if !p.alive() {
			t.Errorf("%s was stopped by the takeover", name)
		}
	}
	// earlier: env-exec'd python3 and its sleep; deaf: python3.
	if rep.Stopped < 3 || rep.Killed < 1 || rep.Left != 0 || strings.Join(rep.Runs, ",") != "r1,r2" || rep.Dirs != 2 {
		t.Errorf("takeover report %+v, want >= 3 stopped, >= 1 killed, none left, runs r1,r2, 2 dirs", rep)
	}
	for _, name := range []string{"autoprov-" + scope, "autoprov-" + scope + ".r1"} {
		if _, err := os.Stat(tmpDir(name)); !os.IsNotExist(err) {
			t.Errorf("tmp dir %s still there after the takeover: %v", name, err)
		}
	}
	if _, err := os.Stat(tmpDir("autoprov-" + other)); err != nil {
		t.Errorf("another server's tmp dir removed by the takeover: %v", err)
	}
	// The run's own play then makes the scope's dir again.
	if err := os.MkdirAll(filepath.Join(tmpDir("autoprov-"+scope), "ansible-tmp-4-5-6"), 0o700); err != nil {
		t.Fatal(err)
	}

	rep = run("cleanup", scope+".r0")
	select {
	case <-ownTask.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("own task still alive after the cleanup")
	}
	if rep.Stopped < 1 || rep.Left != 0 || strings.Join(rep.Runs, ",") != "r0" || rep.Dirs != 1 {
		t.Errorf("cleanup report %+v, want >= 1 stopped, none left, run r0, 1 dir", rep)
	}
	if _, err := os.Stat(tmpDir("autoprov-" + scope)); !os.IsNotExist(err) {
		t.Errorf("the scope's tmp dir still there after the cleanup: %v", err)
	}
	for name, p := range map[string]*fakeProc{"other server's task": otherServer, "daemon": daemon, "unmarked": unmarked} {
		if !p.alive() {
			t.Errorf("%s was stopped by the cleanup", name)
		}
	}
	if rep := run("takeover", scope+".r9"); rep.Stopped != 0 {
		t.Errorf("a second takeover stopped %d processes, want 0", rep.Stopped)
	}
}

// waitExec waits until pid runs something else than /usr/bin/env.
func waitExec(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			t.Fatalf("process %d: %v", pid, err)
		}
		if len(cmd) > 0 && !bytes.HasPrefix(cmd, []byte("/usr/bin/env\x00")) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d never left env", pid)
}
