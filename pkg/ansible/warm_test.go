package ansible

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
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

// warmMasters lists the warm masters alive under r's RunRoot.
func warmMasters(r *Runner) []int {
	var out []int
	for _, p := range processesReferringAny(filepath.Join(r.cfg.RunRoot, warmDirPrefix)) {
		out = append(out, p)
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
