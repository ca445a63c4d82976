package ansible

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// helperEnv makes the test binary act as a helper process (see TestMain).
const helperEnv = "AUTOPROV_ANSIBLE_TEST_HELPER"

// helperConfig is what the parent test hands the helper process.
type helperConfig struct {
	Config    Config
	Host      Host
	KeyPath   string
	TargetTmp string
}

// runHelper is the helper process: it runs sleep.yml through a Runner and
// reports "spawned <pgid> <run dir>" and "task <name>" on stdout; the parent
// kills it with SIGKILL in the middle of the run.
func runHelper(mode string) int {
	if mode == "warm" {
		return runWarmHelper()
	}
	if mode != "lifeline" {
		fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
		return 2
	}
	r, hc, key, code := loadHelper()
	if r == nil {
		return code
	}
	r.hooks.onSpawn = func(pgid int, runDir string) { fmt.Printf("spawned %d %s\n", pgid, runDir) }
	_, err := r.Run(context.Background(), Spec{
		JobID: "lifeline", Playbook: "sleep.yml", Host: hc.Host, SSHKeys: [][]byte{key},
		Vars: map[string]any{"sleep_seconds": 120, "target_tmp": hc.TargetTmp},
		OnEvent: func(ev Event) {
			if ev.Type == EventTaskStart {
				fmt.Printf("task %s\n", ev.Task)
			}
		},
	})
	fmt.Fprintf(os.Stderr, "helper: Run returned (%v) but should have been killed\n", err)
	return 3
}

// loadHelper reads the helper's configuration and key and makes its
// Runner; nil and an exit code when it cannot.
func loadHelper() (*Runner, helperConfig, []byte, int) {
	var hc helperConfig
	b, err := os.ReadFile(os.Getenv(helperEnv + "_CONFIG"))
	if err == nil {
		err = json.Unmarshal(b, &hc)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper config: %v\n", err)
		return nil, hc, nil, 2
	}
	key, err := os.ReadFile(hc.KeyPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper key: %v\n", err)
		return nil, hc, nil, 2
	}
	r, err := New(hc.Config, zerolog.New(os.Stderr))
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: %v\n", err)
		return nil, hc, nil, 2
	}
	return r, hc, key, 0
}

// helperProc is a helper process started by startHelper.
type helperProc struct {
	cmd    *exec.Cmd
	lines  *bufio.Scanner // its stdout
	exited chan struct{}
}

// startHelper starts this test binary as a helper (mode) running against
// s with cfg; it is killed when the test ends, and its stderr shown if the
// test failed.
func startHelper(t *testing.T, mode string, s *testenv.SSHD, cfg Config, targetTmp string) *helperProc {
	t.Helper()
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "client_key")
	if err := os.WriteFile(keyPath, s.ClientKey, 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(helperConfig{Config: cfg, Host: hostOf(s), KeyPath: keyPath, TargetTmp: targetTmp})
	cfgPath := filepath.Join(dir, "helper.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"="+mode, helperEnv+"_CONFIG="+cfgPath)
	stderr := &testenv.SafeBuffer{}
	helper.Stderr = stderr
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: helper, lines: bufio.NewScanner(out), exited: make(chan struct{})}
	go func() { _ = helper.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		_ = helper.Process.Kill()
		<-h.exited
		if t.Failed() {
			t.Logf("helper stderr:\n%s", stderr.String())
		}
	})
	return h
}

// TestGuardKillsGroupWhenServiceDies kills (SIGKILL) the process that runs
// ansible-playbook through runguard, in the middle of a play, and checks
// that the whole process group (ansible-playbook, its workers and ssh
// clients) and the ssh ControlPersist master are gone within seconds; then
// that SweepLeftovers removes the run directory the dead process left.
func TestGuardKillsGroupWhenServiceDies(t *testing.T) {
	t.Parallel()
	requirePlaybook(t)
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	runRoot := shortTempDir(t, "apr")
	cfg := Config{AnsibleDir: testAnsibleDir(t), PlaybookBin: playbookBin, RunRoot: runRoot, GuardPath: guardBin,
		FactCacheDir: t.TempDir(), KillGrace: 10 * time.Second, Timeout: time.Hour, IdleTimeout: 10 * time.Minute}
	targetTmp := targetDir(t)
	h := startHelper(t, "lifeline", s, cfg, targetTmp)
	helper, lines, exited := h.cmd, h.lines, h.exited

	var pgid int
	var runDir string
	deadline := time.AfterFunc(2*time.Minute, func() { _ = helper.Process.Kill() })
	defer deadline.Stop()
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "task Sleep") {
		if _, err := fmt.Sscanf(lines.Text(), "spawned %d %s", &pgid, &runDir); err == nil {
			t.Logf("helper runs ansible in group %d, run dir %s", pgid, runDir)
		}
	}
	if pgid == 0 {
		t.Fatalf("helper never reached the Sleep task")
	}
	testenv.WaitFor(t, time.Minute, "the ssh ControlPersist master", func() bool { return masterOutsideGroup(pgid, runDir) })
	testenv.WaitFor(t, time.Minute, "the Sleep task's command on the target", func() bool { return moduleRunning(targetTmp) })
	members := proc.GroupMembers(pgid)
	t.Logf("group before the kill:%s%s", processDesc(members), processDesc(processesReferring(runDir)))

	killed := time.Now()
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	testenv.WaitFor(t, 5*time.Second, "the process group and the ssh master to go", func() bool {
		return len(proc.GroupMembers(pgid)) == 0 && len(processesReferring(runDir)) == 0
	})
	t.Logf("everything gone %s after SIGKILL of the service process", time.Since(killed).Round(time.Millisecond))

	if _, err := os.Stat(filepath.Join(runDir, markerName)); err != nil {
		t.Fatalf("the dead run's directory should be left for the sweep: %v", err)
	}
	r, _ := newTestRunner(t, func(c *Config) { c.RunRoot = runRoot })
	removed, err := r.SweepLeftovers()
	if err != nil || removed != 1 {
		t.Fatalf("SweepLeftovers = %d, %v; want 1, nil", removed, err)
	}
	if _, err := os.Lstat(runDir); !os.IsNotExist(err) {
		t.Fatalf("run dir still there after the sweep: %v", err)
	}

	// The task's command on the target outlived its controller (nothing
	// there noticed the death)...
	if !moduleRunning(targetTmp) {
		t.Fatalf("the Sleep task's command is gone from the target with its controller: nothing left to take over")
	}
	// ...until the next run of the server takes over: it stops it before
	// its own play starts.
	// The takeover runs while ansible-playbook starts up; the play's first
	// task waits for it (gate.go).
	var overlapped, checked atomic.Bool
	spec := specFor(s, "ping.yml", nil)
	spec.OnEvent = func(ev Event) {
		if ev.Type == EventTaskStart && !checked.Swap(true) {
			overlapped.Store(moduleRunning(targetTmp))
		}
	}
	res, err := r.Run(context.Background(), spec)
	if err != nil || res.Outcome != OutcomeSucceeded {
		t.Fatalf("next run: %v %+v", err, res)
	}
	if !checked.Load() {
		t.Errorf("the next run reported no task start")
	}
	if overlapped.Load() {
		t.Errorf("the next run's play started while the killed run's task still ran on the target")
	}
	if moduleRunning(targetTmp) {
		t.Errorf("the killed run's task still runs on the target after the takeover")
	}
	if tk := res.Takeover; tk == nil || tk.Stopped < 2 || tk.Left != 0 || len(tk.Runs) != 1 {
		t.Errorf("Takeover = %+v, want the killed run's python and sleep stopped", tk)
	}
}
