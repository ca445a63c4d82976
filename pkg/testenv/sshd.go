package testenv

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHDPath is where Debian's openssh-server installs sshd. sshd re-executes
// itself, so it must be started with an absolute path.
const SSHDPath = "/usr/sbin/sshd"

// SSHDOptions configures StartSSHD. The zero value is a loopback sshd with an
// ed25519 host key that lets the default user in with the client key.
type SSHDOptions struct {
	// User is the login user. Default: "root" when the test runs as root
	// (sshd then uses PermitRootLogin prohibit-password), else the current
	// user (sshd then runs unprivileged: without privilege separation, and
	// only that user can log in).
	User string
	// ExtraHostKeyTypes adds host keys of these types besides ed25519:
	// "rsa" (3072 bits) and/or "ecdsa" (P-256).
	ExtraHostKeyTypes []string
}

// SSHD is a real OpenSSH sshd on 127.0.0.1 owned by one test: its own host
// keys, config, pid file and authorized_keys in t.TempDir(), and a generated
// ed25519 client key authorized for User. Everything it started is stopped
// when the test ends; its log is shown when the test fails.
type SSHD struct {
	// Addr is "127.0.0.1:<Port>".
	Addr string
	// Host is the address sshd listens on (127.0.0.1).
	Host string
	// Port is the TCP port sshd listens on; it stays the same over restarts.
	Port int
	// User is the login user.
	User string
	// HostKey is the ed25519 host public key in authorized_keys format
	// ("ssh-ed25519 AAAA..."), as a server's pinned key is stored.
	HostKey string
	// HostKeys holds every host public key (HostKey first), same format.
	HostKeys []string
	// HostKeyPath is the ed25519 host private key file.
	HostKeyPath string
	// ClientKey is the client private key (OpenSSH PEM) authorized for User.
	ClientKey []byte
	// ClientPublicKey is its public key in authorized_keys format.
	ClientPublicKey string
	// Dir holds config, keys, pid file and log.
	Dir string

	t          testing.TB
	opts       SSHDOptions
	configPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  lockedBuffer
}

// StartSSHD starts sshd -D -e -f <config> as a child of the test on a free
// loopback port and waits until it listens. It fails the test with a clear
// message when sshd is missing (install Debian's openssh-server).
func StartSSHD(t testing.TB, opts SSHDOptions) *SSHD {
	t.Helper()
	skipShort(t, "sshd")
	if _, err := os.Stat(SSHDPath); err != nil {
		t.Fatalf("sshd test host: %s missing (%v); install Debian's openssh-server (scripts/services.sh deps)", SSHDPath, err)
	}
	if opts.User == "" {
		if os.Geteuid() == 0 {
			opts.User = "root"
		} else {
			u, err := user.Current()
			if err != nil {
				t.Fatalf("sshd test host: current user: %v", err)
			}
			opts.User = u.Username
		}
	}
	if os.Geteuid() == 0 {
		// The privilege separation directory normally comes from systemd's
		// tmpfiles; sshd refuses to start without it.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatalf("sshd test host: create /run/sshd: %v", err)
		}
	}
	s := &SSHD{Host: "127.0.0.1", User: opts.User, Dir: t.TempDir(), t: t, opts: opts}
	s.HostKeyPath = filepath.Join(s.Dir, "ssh_host_ed25519_key")
	s.configPath = filepath.Join(s.Dir, "sshd_config")

	clientPriv, clientPub := NewSSHKey(t, "ed25519")
	s.ClientKey = clientPriv
	s.ClientPublicKey = clientPub
	writeFile(t, filepath.Join(s.Dir, "authorized_keys"), []byte(clientPub+"\n"), 0o600)
	s.writeHostKeys()

	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", s.Addr, s.log.String())
		}
	})
	// The port comes from FreePort: retry with another one when something
	// took it between the check and sshd's bind.
	for attempt := 0; ; attempt++ {
		s.Port = FreePort(t)
		s.Addr = net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
		s.writeConfig()
		err := s.start()
		if err == nil {
			return s
		}
		if attempt >= 4 || !strings.Contains(s.log.String(), "Address already in use") {
			t.Fatalf("sshd test host: %v\n%s", err, s.log.String())
		}
	}
}

// NewSSHKey returns a new private key of typ (ed25519, rsa or ecdsa;
// OpenSSH PEM) and its public key line: a key no test host authorizes
// unless told.
func NewSSHKey(t testing.TB, typ string) (priv []byte, pub string) {
	t.Helper()
	var key crypto.Signer
	var err error
	switch typ {
	case "ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 3072)
	case "ecdsa":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		t.Fatalf("sshd test host: unknown key type %q", typ)
	}
	if err != nil {
		t.Fatalf("sshd test host: generate %s key: %v", typ, err)
	}
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatalf("sshd test host: marshal %s key: %v", typ, err)
	}
	signer, err := ssh.NewSignerFromSigner(key)
	if err != nil {
		t.Fatalf("sshd test host: %s signer: %v", typ, err)
	}
	return pem.EncodeToMemory(block), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}

func writeFile(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatalf("sshd test host: write %s: %v", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatalf("sshd test host: chmod %s: %v", path, err)
	}
}

func (s *SSHD) hostKeyFile(typ string) string {
	return filepath.Join(s.Dir, "ssh_host_"+typ+"_key")
}

// writeHostKeys generates a fresh set of host keys.
func (s *SSHD) writeHostKeys() {
	s.HostKeys = nil
	for _, typ := range append([]string{"ed25519"}, s.opts.ExtraHostKeyTypes...) {
		priv, pub := NewSSHKey(s.t, typ)
		writeFile(s.t, s.hostKeyFile(typ), priv, 0o600)
		s.HostKeys = append(s.HostKeys, pub)
	}
	s.HostKey = s.HostKeys[0]
}

func (s *SSHD) writeConfig() {
	var b strings.Builder
	fmt.Fprintf(&b, "ListenAddress %s\n", s.Addr)
	for _, typ := range append([]string{"ed25519"}, s.opts.ExtraHostKeyTypes...) {
		fmt.Fprintf(&b, "HostKey %s\n", s.hostKeyFile(typ))
	}
	fmt.Fprintf(&b, "PidFile %s\n", filepath.Join(s.Dir, "sshd.pid"))
	fmt.Fprintf(&b, "AuthorizedKeysFile %s\n", filepath.Join(s.Dir, "authorized_keys"))
	fmt.Fprintf(&b, "AllowUsers %s\n", s.User)
	// Sessions get a HOME of their own: the login user is this machine's
	// (root when the tests run as root), and bash would otherwise source
	// its ~/.bashrc for every command; there, tools like pyenv change PATH
	// (and Ansible's interpreter) and take a lock on each shell start, which
	// stalls concurrent sessions. sshd applies SetEnv after its defaults.
	// TMPDIR too: a module killed mid-task (the cancel and takeover tests)
	// leaves its AnsiballZ payload dir in the temp dir; here it goes with
	// the test's own.
	home, tmp := filepath.Join(s.Dir, "home"), filepath.Join(s.Dir, "tmp")
	for _, dir := range []string{home, tmp} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			s.t.Fatalf("session dirs: %v", err)
		}
	}
	fmt.Fprintf(&b, "SetEnv HOME=%s TMPDIR=%s\n", home, tmp)
	// t.TempDir() lies under the world-writable /tmp, which StrictModes
	// rejects for authorized_keys; the directory itself is private.
	b.WriteString(`StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PermitUserEnvironment no
MaxStartups 100:30:200
MaxSessions 100
LogLevel VERBOSE
Subsystem sftp /usr/lib/openssh/sftp-server
`)
	writeFile(s.t, s.configPath, []byte(b.String()), 0o600)
}

// start runs sshd and waits until it listens; it returns an error when sshd
// exits first or does not listen within 15 s.
func (s *SSHD) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	listening := make(chan struct{})
	s.log.notify("Server listening on", listening)
	// A pipe of our own, not an io.Writer: per-connection processes inherit
	// sshd's stderr, and Wait must not wait for them to close it.
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	go func() {
		defer r.Close()
		_, _ = io.Copy(&s.log, r)
	}()
	cmd := exec.Command(SSHDPath, "-D", "-e", "-f", s.configPath)
	cmd.Stdout = w
	cmd.Stderr = w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", SSHDPath, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	select {
	case <-listening:
		return nil
	case <-done:
		return fmt.Errorf("sshd exited before listening on %s (%v)", s.Addr, cmd.ProcessState)
	case <-time.After(15 * time.Second):
		return fmt.Errorf("sshd did not listen on %s within 15s", s.Addr)
	}
}

// PID returns the process id of the sshd listener (0 when stopped).
func (s *SSHD) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	select {
	case <-s.done:
		return 0
	default:
		return s.cmd.Process.Pid
	}
}

// Log returns what sshd logged so far (all runs).
func (s *SSHD) Log() string { return s.log.String() }

// Stop stops sshd and everything it started: the listener, its
// per-connection processes and every process run through it (found by the
// SSH_CONNECTION variable naming this port, as session commands outlive
// their connection). It is idempotent.
func (s *SSHD) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	select {
	case <-s.done:
	default:
		for _, p := range sshdOffspring(pid, s.Port) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-s.done
		}
	}
	// Session commands started just before the listener went away.
	for _, p := range sshdOffspring(0, s.Port) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	s.cmd = nil
}

// Restart stops sshd and starts it again on the same port with the current
// host keys and config.
func (s *SSHD) Restart() {
	s.t.Helper()
	s.Stop()
	// A just-closed listening port can be rebound at once (sshd sets
	// SO_REUSEADDR); retry briefly in case it is still held.
	var err error
	for i := 0; i < 10; i++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Fatalf("sshd test host: restart: %v\n%s", err, s.log.String())
}

// RotateHostKey gives sshd new host keys (as a reinstalled server would
// have) and restarts it; HostKey, HostKeys and the key files change.
func (s *SSHD) RotateHostKey() {
	s.t.Helper()
	s.Stop()
	s.writeHostKeys()
	s.Restart()
}

// Pause stops the listener with SIGSTOP: the port still accepts TCP
// connections (the kernel's backlog) but no SSH banner ever comes, like a
// host that hangs. Resume undoes it.
func (s *SSHD) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused listener (SIGCONT).
func (s *SSHD) Resume() { s.signal(syscall.SIGCONT) }

func (s *SSHD) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("sshd test host: %v while stopped", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("sshd test host: %v: %v", sig, err)
	}
}

// ClosedPort returns a loopback port on which connections are refused. The
// port is bound (without listening) until the test ends, so nothing else can
// take it meanwhile.
func ClosedPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("closed port: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("closed port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("closed port: getsockname: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// sshdOffspring returns the descendants of pid (when pid > 0) and every
// process whose SSH_CONNECTION names server port port on 127.0.0.1.
func sshdOffspring(pid, port int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	var found []int
	seen := map[int]bool{}
	marker := []byte(" 127.0.0.1 " + strconv.Itoa(port) + "\x00")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					parent[p], _ = strconv.Atoi(f[1])
				}
			}
		}
		if env, err := os.ReadFile("/proc/" + e.Name() + "/environ"); err == nil {
			if i := bytes.Index(env, []byte("SSH_CONNECTION=")); i >= 0 {
				rest := env[i:]
				if j := bytes.IndexByte(rest, 0); j >= 0 && bytes.HasSuffix(rest[:j+1], marker) {
					found, seen[p] = append(found, p), true
				}
			}
		}
	}
	if pid > 0 {
		for p := range parent {
			for q, n := p, 0; q > 1 && n < 64; q, n = parent[q], n+1 {
				if parent[q] == pid && !seen[p] {
					found, seen[p] = append(found, p), true
					break
				}
			}
		}
	}
	return found
}

// lockedBuffer collects process output and signals when a text appears.
type lockedBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	want   string
	signal chan struct{}
}

func (b *lockedBuffer) notify(want string, ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.want, b.signal = want, ch
	b.buf.WriteString("--- sshd start ---\n")
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := b.buf.Len() - len(b.want)
	b.buf.Write(p)
	if b.signal != nil {
		if start < 0 {
			start = 0
		}
		if bytes.Contains(b.buf.Bytes()[start:], []byte(b.want)) {
			close(b.signal)
			b.signal = nil
		}
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
