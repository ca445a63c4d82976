package testenv

import (
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// sshRun logs in to s with its client key, pinning hostKey, and runs cmd.
func sshRun(t *testing.T, s *SSHD, hostKey, cmd string) (string, error) {
	return sshRunTimeout(t, s, hostKey, cmd, 10*time.Second)
}

// sshRunTimeout is sshRun with a deadline for the whole exchange.
func sshRunTimeout(t *testing.T, s *SSHD, hostKey, cmd string, timeout time.Duration) (string, error) {
	t.Helper()
	pinned, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hostKey))
	if err != nil {
		t.Fatalf("parse host key: %v", err)
	}
	signer, err := ssh.ParsePrivateKey(s.ClientKey)
	if err != nil {
		t.Fatalf("parse client key: %v", err)
	}
	// ssh.Dial's timeout covers only the TCP connect; a paused sshd accepts
	// and then never answers, so bound the handshake with a deadline.
	conn, err := net.DialTimeout("tcp", s.Addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	c, chans, reqs, err := ssh.NewClientConn(conn, s.Addr, &ssh.ClientConfig{
		User:              s.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   ssh.FixedHostKey(pinned),
		HostKeyAlgorithms: []string{pinned.Type()},
	})
	if err != nil {
		return "", err
	}
	client := ssh.NewClient(c, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

func TestSSHDLoginAndRotate(t *testing.T) {
	t.Parallel()
	s := StartSSHD(t, SSHDOptions{ExtraHostKeyTypes: []string{"ecdsa"}})
	if len(s.HostKeys) != 2 || !strings.HasPrefix(s.HostKey, "ssh-ed25519 ") || !strings.HasPrefix(s.HostKeys[1], "ecdsa-sha2-nistp256 ") {
		t.Fatalf("host keys = %q", s.HostKeys)
	}
	out, err := sshRun(t, s, s.HostKey, "id -un")
	if err != nil {
		t.Fatalf("ssh with pinned ed25519 key: %v", err)
	}
	if strings.TrimSpace(out) != s.User {
		t.Fatalf("logged in as %q, want %q", out, s.User)
	}
	if _, err := sshRun(t, s, s.HostKeys[1], "true"); err != nil {
		t.Fatalf("ssh with pinned ecdsa key: %v", err)
	}

	old := s.HostKey
	s.RotateHostKey()
	if s.HostKey == old {
		t.Fatal("RotateHostKey kept the host key")
	}
	if _, err := sshRun(t, s, old, "true"); err == nil || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("ssh with the old pinned key: err = %v, want host key mismatch", err)
	}
	if _, err := sshRun(t, s, s.HostKey, "true"); err != nil {
		t.Fatalf("ssh with the new key: %v", err)
	}
}

func TestSSHDPauseAndClosedPort(t *testing.T) {
	t.Parallel()
	s := StartSSHD(t, SSHDOptions{})
	s.Pause()
	start := time.Now()
	_, err := sshRunTimeout(t, s, s.HostKey, "true", 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("ssh to a paused sshd: err = %v, want a timeout", err)
	}
	t.Logf("paused sshd: %v after %s", err, time.Since(start))
	s.Resume()
	if _, err := sshRun(t, s, s.HostKey, "true"); err != nil {
		t.Fatalf("ssh after Resume: %v", err)
	}

	port := ClosedPort(t)
	_, err = net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 3*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial closed port: %v, want connection refused", err)
	}
}

func TestSSHDStopKillsSessions(t *testing.T) {
	t.Parallel()
	s := StartSSHD(t, SSHDOptions{})
	// A session command that outlives its connection.
	if _, err := sshRun(t, s, s.HostKey, "nohup sleep 300 >/dev/null 2>&1 & echo started"); err != nil {
		t.Fatalf("ssh: %v", err)
	}
	// The backgrounded shell may not have exec'd sleep yet when ssh returns.
	var left []int
	for deadline := time.Now().Add(5 * time.Second); len(left) == 0 && time.Now().Before(deadline); {
		for _, p := range sshdOffspring(0, s.Port) {
			if cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline"); strings.HasPrefix(string(cmd), "sleep\x00300") {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if len(left) != 1 {
		t.Fatalf("session processes found: %v, want the sleep", left)
	}
	s.Stop()
	if s.PID() != 0 {
		t.Fatal("sshd still running after Stop")
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(left[0], 0) == nil {
		if stat, _ := os.ReadFile("/proc/" + strconv.Itoa(left[0]) + "/stat"); strings.Contains(string(stat), ") Z ") {
			break // a zombie waiting for init
		}
		if time.Now().After(deadline) {
			t.Fatalf("session process %d survived Stop", left[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Restart()
	if _, err := sshRun(t, s, s.HostKey, "true"); err != nil {
		t.Fatalf("ssh after Restart: %v", err)
	}
}
