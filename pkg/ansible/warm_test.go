package ansible

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// sshdCount counts the lines of the sshd's log holding what: a connection
// ("Connection from") or a login ("Accepted publickey").
func sshdCount(s *testenv.SSHD, what string) int { return strings.Count(s.Log(), what) }

// warmMasters lists the warm masters alive under r's RunRoot (not the
// plays' ssh clients, which name the same ControlPath).
func warmMasters(r *Runner) []int {
	var out []int
	for _, p := range processesReferringAny(filepath.Join(r.cfg.RunRoot, warmDirPrefix)) {
		if cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline"); strings.Contains(string(cmd), "ControlMaster=yes") {
			out = append(out, p)
		}
	}
	return out
}

// processesReferringAny lists live processes (any user) whose command line
// contains prefix.
func processesReferringAny(prefix string) []int {
	var out []int
	proc.Each(func(pid int) {
		cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), prefix) || pid == os.Getpid() {
			return
		}
		if st, err := proc.ReadStat(pid); err == nil && st.Live() {
			out = append(out, pid)
		}
	})
	return out
}

// waitGone waits until pid is no longer a live process.
func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := proc.ReadStat(pid)
		if err != nil || !st.Live() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %s:%s", pid, within, processDesc([]int{pid}))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runOK runs spec and fails the test unless the play succeeded.
func runOK(t *testing.T, r *Runner, spec Spec) *Result {
	t.Helper()
	res, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != OutcomeSucceeded {
		t.Fatalf("outcome %s: %v\n%s", res.Outcome, res.Err, res.OutputTail)
	}
	return res
}

// TestWarmConnectionReused runs plays back to back with warm connections
// on and checks on the sshd's side that they share one SSH connection:
// one login for several runs (takeover and play tasks included), a new
// one for another key, and none left after the idle time.
func TestWarmConnectionReused(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, func(c *Config) { c.WarmIdle = 2 * time.Second })
	t.Cleanup(r.Close)

	before := sshdCount(s, "Accepted publickey")
	for range 3 {
		runOK(t, r, specFor(s, "ping.yml", nil))
	}
	if got := sshdCount(s, "Accepted publickey") - before; got != 1 {
		t.Fatalf("3 warm runs made %d SSH logins, want 1 (one master):\n%s", got, s.Log())
	}
	masters := warmMasters(r)
	if len(masters) != 1 {
		t.Fatalf("warm masters %v, want one:%s", masters, processDesc(masters))
	}
	if n := r.WarmConnections(); n != 1 {
		t.Fatalf("WarmConnections() = %d with one master open", n)
	}

	// Another key authorized for the same user: a master of its own.
	other := authorizeNewKey(t, s)
	spec := specFor(s, "ping.yml", nil)
	spec.SSHKeys = [][]byte{other}
	before = sshdCount(s, "Accepted publickey")
	runOK(t, r, spec)
	if got := sshdCount(s, "Accepted publickey") - before; got != 1 {
		t.Fatalf("a run with another key made %d logins, want 1 (its own master)", got)
	}
	// The first key's master was closed when the other key's run started
	// (another scope of the same host).
	waitGone(t, masters[0], 5*time.Second)
	if m := warmMasters(r); len(m) != 1 || m[0] == masters[0] {
		t.Fatalf("warm masters %v after the key change, want one new one", m)
	}

	// Idle: the master and its directory go.
	last := warmMasters(r)[0]
	waitGone(t, last, 10*time.Second)
	testenv.WaitFor(t, 5*time.Second, "WarmConnections() back to 0", func() bool { return r.WarmConnections() == 0 })
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := filepath.Glob(filepath.Join(r.cfg.RunRoot, warmDirPrefix+"*"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm directories left after the idle time: %v", ents)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWarmConnectionDropped: a master the server dropped (its sshd
// process killed) or that was killed itself never fails the next run,
// which gets a new master.
func TestWarmConnectionDropped(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, func(c *Config) { c.WarmIdle = time.Minute })
	t.Cleanup(r.Close)
	runOK(t, r, specFor(s, "ping.yml", nil))

	// The server's side: every session process of the sshd goes.
	for _, p := range childrenOf(s.PID()) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	before := sshdCount(s, "Accepted publickey")
	runOK(t, r, specFor(s, "ping.yml", nil))
	if got := sshdCount(s, "Accepted publickey") - before; got != 1 {
		t.Fatalf("after the server dropped the master: %d logins, want 1 (a new master)", got)
	}

	// The master itself killed, leaving its socket behind.
	m := warmMasters(r)
	if len(m) != 1 {
		t.Fatalf("warm masters %v", m)
	}
	_ = syscall.Kill(m[0], syscall.SIGKILL)
	runOK(t, r, specFor(s, "ping.yml", nil))
	if n := warmMasters(r); len(n) != 1 || n[0] == m[0] {
		t.Fatalf("warm masters %v after the old one was killed, want a new one", n)
	}
	r.Close()
	if left := warmMasters(r); len(left) > 0 {
		t.Fatalf("masters left after Close:%s", processDesc(left))
	}
	if ents, _ := filepath.Glob(filepath.Join(r.cfg.RunRoot, warmDirPrefix+"*")); len(ents) > 0 {
		t.Fatalf("warm directories left after Close: %v", ents)
	}
}

// childrenOf lists the live children of pid.
func childrenOf(pid int) []int {
	var out []int
	proc.Each(func(p int) {
		if st, err := proc.ReadStat(p); err == nil && st.Live() && st.PPid == pid {
			out = append(out, p)
		}
	})
	return out
}

// authorizeNewKey makes an ed25519 key, authorizes it on s and returns it
// (OpenSSH PEM).
func authorizeNewKey(t *testing.T, s *testenv.SSHD) []byte {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(ssh.MarshalAuthorizedKey(signer.PublicKey())); err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block)
}

// runWarmHelper is the helper process of TestWarmMasterDiesWithService:
// one run with warm connections on, then "master <pid> <dir>" on stdout,
// and it waits to be killed.
func runWarmHelper() int {
	r, hc, key, code := loadHelper()
	if r == nil {
		return code
	}
	res, err := r.Run(context.Background(), Spec{JobID: "warm", Playbook: "ping.yml", Host: hc.Host, SSHKeys: [][]byte{key}})
	if err != nil || res.Outcome != OutcomeSucceeded {
		fmt.Fprintf(os.Stderr, "helper run: %v %+v\n", err, res)
		return 3
	}
	for _, c := range r.warm.conns {
		fmt.Printf("master %d %s\n", c.pid(), c.dir)
	}
	select {}
}

// TestWarmMasterDiesWithService kills (SIGKILL) a process that holds a
// warm master: the master dies with it (Pdeathsig), and SweepLeftovers
// removes its directory.
func TestWarmMasterDiesWithService(t *testing.T) {
	t.Parallel()
	requirePlaybook(t)
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	runRoot := shortTempDir(t, "apr")
	cfg := Config{AnsibleDir: testAnsibleDir(t), PlaybookBin: playbookBin, RunRoot: runRoot, GuardPath: guardBin,
		FactCacheDir: t.TempDir(), KillGrace: 3 * time.Second, Timeout: time.Hour, IdleTimeout: 10 * time.Minute, WarmIdle: time.Hour}
	h := startHelper(t, "warm", s, cfg, "")
	helper, lines, exited := h.cmd, h.lines, h.exited
	deadline := time.AfterFunc(2*time.Minute, func() { _ = helper.Process.Kill() })
	defer deadline.Stop()
	var pid int
	var warmDir string
	for pid == 0 && lines.Scan() {
		_, _ = fmt.Sscanf(lines.Text(), "master %d %s", &pid, &warmDir)
	}
	if pid == 0 {
		t.Fatal("the helper reported no warm master")
	}
	if st, err := proc.ReadStat(pid); err != nil || !st.Live() {
		t.Fatalf("warm master %d not running after the run", pid)
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	waitGone(t, pid, 5*time.Second)

	r, _ := newTestRunner(t, func(c *Config) { c.RunRoot = runRoot })
	if removed, err := r.SweepLeftovers(); err != nil || removed != 1 {
		t.Fatalf("SweepLeftovers = %d, %v; want the warm directory", removed, err)
	}
	if _, err := os.Lstat(warmDir); !os.IsNotExist(err) {
		t.Fatalf("warm directory %s still there after the sweep: %v", warmDir, err)
	}
}

// TestWarmConnectionAsPlayUser: with Config.RunAs, the master runs as the
// play user (ssh multiplexes for clients of its own user only), and the
// plays' ssh go through it.
func TestWarmConnectionAsPlayUser(t *testing.T) {
	t.Parallel()
	cred := playUserCredential(t)
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, func(c *Config) {
		c.RunAs = cred
		c.FactCacheDir = shortTempDir(t, "apf")
		c.WarmIdle = time.Minute
	})
	t.Cleanup(r.Close)
	before := sshdCount(s, "Accepted publickey")
	runOK(t, r, specFor(s, "whoami.yml", nil))
	runOK(t, r, specFor(s, "whoami.yml", nil))
	if got := sshdCount(s, "Accepted publickey") - before; got != 1 {
		t.Fatalf("2 warm runs as the play user made %d SSH logins, want 1", got)
	}
	m := warmMasters(r)
	if len(m) != 1 {
		t.Fatalf("warm masters %v", m)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(m[0]), &st); err != nil || st.Uid != cred.UID {
		t.Fatalf("warm master runs as uid %d (%v), want the play user's %d", st.Uid, err, cred.UID)
	}
	// The play user owns the socket's directory only: the pinned host key
	// a later master trusts, and the marker, are not its to change.
	dirs, _ := filepath.Glob(filepath.Join(r.cfg.RunRoot, warmDirPrefix+"*"))
	if len(dirs) != 1 {
		t.Fatalf("warm directories %v", dirs)
	}
	for path, wantUID := range map[string]uint32{
		dirs[0]: 0, filepath.Join(dirs[0], "known_hosts"): 0, filepath.Join(dirs[0], markerName): 0,
		filepath.Join(dirs[0], "s"): cred.UID,
	} {
		var fi syscall.Stat_t
		if err := syscall.Lstat(path, &fi); err != nil || fi.Uid != wantUID || fi.Mode&0o022 != 0 {
			t.Errorf("%s: uid %d mode %o (%v), want uid %d and no write for others", path, fi.Uid, fi.Mode&0o777, err, wantUID)
		}
	}
}

// TestWarmScope: any change of who logs in where is another scope.
func TestWarmScope(t *testing.T) {
	h := Host{Alias: "web-1", Address: "192.0.2.1", Port: 22, User: "deploy"}
	key := pinnedKey{line: testHostKey(t)}
	keys := [][]byte{[]byte("key-a")}
	base := warmScope(h, key, keys)
	if warmScope(h, key, [][]byte{[]byte("key-a")}) != base {
		t.Fatal("the same inputs gave another scope")
	}
	for name, scope := range map[string]string{
		"key":      warmScope(h, key, [][]byte{[]byte("key-b")}),
		"keys":     warmScope(h, key, [][]byte{[]byte("key-a"), []byte("key-b")}),
		"host key": warmScope(h, pinnedKey{line: testHostKey(t)}, keys),
		"user":     warmScope(Host{Alias: h.Alias, Address: h.Address, Port: h.Port, User: "root"}, key, keys),
		"port":     warmScope(Host{Alias: h.Alias, Address: h.Address, Port: 2222, User: h.User}, key, keys),
		"address":  warmScope(Host{Alias: h.Alias, Address: "192.0.2.2", Port: h.Port, User: h.User}, key, keys),
		"alias":    warmScope(Host{Alias: "web-2", Address: h.Address, Port: h.Port, User: h.User}, key, keys),
	} {
		if scope == base {
			t.Errorf("another %s, same scope", name)
		}
	}
}

// TestWarmSSHArgs: the play's ssh never starts a master of its own, and
// Ansible still sees ControlPersist (it adds the ControlPath only then).
func TestWarmSSHArgs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, cfg, want string }{
		{"repo", "", "-o ControlMaster=no -o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=15"},
		{"none", "[defaults]\nforks = 1\n", "-o ControlMaster=no -C -o ControlMaster=auto -o ControlPersist=60s"},
		{"no persist", "[ssh_connection]\nssh_args = -o ServerAliveInterval=5\n", "-o ControlMaster=no -o ServerAliveInterval=5 -o ControlPersist=60s"},
		{"other section", "[defaults]\nssh_args = -o X=1\n[ssh_connection]\npipelining = True\n", "-o ControlMaster=no -C -o ControlMaster=auto -o ControlPersist=60s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(testAnsibleDir(t), "ansible.cfg")
			if tc.cfg != "" {
				path = filepath.Join(dir, tc.name+".cfg")
				if err := os.WriteFile(path, []byte(tc.cfg), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := warmSSHArgs(path); !strings.HasPrefix(got, tc.want) {
				t.Errorf("warmSSHArgs = %q, want it to start with %q", got, tc.want)
			}
		})
	}
}
