package ansible

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// guardBin is the runguard binary built for this test process.
var guardBin string

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	dir, err := os.MkdirTemp("", "runguard-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guardBin = filepath.Join(dir, "runguard")
	if err := testenv.GoBuild(guardBin, "./cmd/runguard", true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// playbookBin is Debian's ansible-playbook, the tests' and the service's.
const playbookBin = "/usr/bin/ansible-playbook"

// requirePlaybook fails the test unless Debian's ansible-playbook exists.
func requirePlaybook(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(playbookBin); err != nil {
		t.Fatalf("%s missing (%v): install Debian's ansible-core (scripts/services.sh deps)", playbookBin, err)
	}
}

// shortTempDir is a directory with a short path (RunRoot is limited to 32
// bytes; t.TempDir() paths are longer), removed when the test ends.
func shortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func testAnsibleDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs("testdata/ansible")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// newTestRunner returns a Runner over testdata/ansible with its own RunRoot
// and the logs it writes.
func newTestRunner(t testing.TB, mutate func(*Config)) (*Runner, *testenv.SafeBuffer) {
	t.Helper()
	requirePlaybook(t)
	cfg := Config{
		AnsibleDir:   testAnsibleDir(t),
		PlaybookBin:  playbookBin,
		RunRoot:      shortTempDir(t, "apr"),
		GuardPath:    guardBin,
		FactCacheDir: t.TempDir(),
		KillGrace:    3 * time.Second,
		Timeout:      time.Hour,
		IdleTimeout:  10 * time.Minute,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	logs := &testenv.SafeBuffer{}
	log := zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), logs)).With().Timestamp().Logger()
	r, err := New(cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r, logs
}

// hostOf is the inventory host for a test sshd.
func hostOf(s *testenv.SSHD) Host {
	return Host{Alias: "target-1", Address: s.Host, Port: s.Port, User: s.User, KnownHostsKey: s.HostKey}
}

// specFor is a spec running playbook against s with its client key.
func specFor(s *testenv.SSHD, playbook string, vars map[string]any) Spec {
	return Spec{
		JobID:    testenv.Unique("job-"),
		Playbook: playbook,
		Host:     hostOf(s),
		Vars:     vars,
		SSHKeys:  [][]byte{s.ClientKey},
	}
}

// eventLog collects the events of a run.
type eventLog struct {
	mu     sync.Mutex
	events []Event
	notify func(Event)
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	n := l.notify
	l.mu.Unlock()
	if n != nil {
		n(ev)
	}
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

func (l *eventLog) types() []string {
	var out []string
	for _, ev := range l.all() {
		out = append(out, ev.Type)
	}
	return out
}

// spawned records the process group and run dir of a run (hooks.onSpawn).
type spawned struct {
	mu     sync.Mutex
	pgid   int
	runDir string
	ready  chan struct{}
}

func watchSpawn(r *Runner) *spawned {
	s := &spawned{ready: make(chan struct{})}
	r.hooks.onSpawn = func(pgid int, runDir string) {
		s.mu.Lock()
		s.pgid, s.runDir = pgid, runDir
		s.mu.Unlock()
		close(s.ready)
	}
	return s
}

func (s *spawned) get() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pgid, s.runDir
}

// processDesc describes pids for failure messages.
func processDesc(pids []int) string {
	var b strings.Builder
	for _, p := range pids {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		fmt.Fprintf(&b, "\n  %d: %s", p, strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return b.String()
}

// assertNothingLeft fails unless no live process is in group pgid or
// mentions runDir, and runDir is gone.
func assertNothingLeft(t testing.TB, pgid int, runDir string) {
	t.Helper()
	if pgid <= 0 || runDir == "" {
		t.Fatalf("run was never spawned (pgid %d, run dir %q)", pgid, runDir)
	}
	if left := proc.GroupMembers(pgid); len(left) > 0 {
		t.Errorf("processes left in group %d:%s", pgid, processDesc(left))
	}
	if left := processesReferring(runDir); len(left) > 0 {
		t.Errorf("processes referring to %s left:%s", runDir, processDesc(left))
	}
	if _, err := os.Lstat(runDir); !os.IsNotExist(err) {
		t.Errorf("run dir %s still exists (%v)", runDir, err)
	}
}

// moduleRunning tells whether the Sleep task's command runs on the target
// (this machine): a sleep process with the run's TMPDIR (sleep.yml's
// target_tmp) in its environment.
func moduleRunning(targetTmp string) bool {
	found := false
	proc.Each(func(pid int) {
		if found {
			return
		}
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if !bytes.HasPrefix(cmd, []byte("sleep\x00")) {
			return
		}
		env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		found = bytes.Contains(env, []byte("\x00TMPDIR="+targetTmp+"\x00")) || bytes.HasPrefix(env, []byte("TMPDIR="+targetTmp+"\x00"))
	})
	return found
}

// masterOutsideGroup tells whether an ssh ControlPersist master of the run
// (it left the process group by setsid) is up.
func masterOutsideGroup(pgid int, runDir string) bool {
	for _, p := range processesReferring(runDir) {
		st, err := proc.ReadStat(p)
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		if err == nil && st.Pgrp != pgid && bytes.HasPrefix(cmd, []byte("ssh: ")) {
			return true
		}
	}
	return false
}

func testLogger(t testing.TB) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

// testHostKey is a fresh ed25519 public key in authorized_keys format.
func testHostKey(t testing.TB) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// execOutput runs an Ansible tool with the test config and a private HOME.
func execOutput(t testing.TB, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = []string{"PATH=" + safePath, "HOME=" + t.TempDir(), "LC_ALL=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(testAnsibleDir(t), "ansible.cfg")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
