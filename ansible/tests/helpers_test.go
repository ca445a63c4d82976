// Package tests holds the tests of the Ansible content: lint and syntax
// checks, the event callback, and the playbooks run for real against
// debootstrap targets (package target). They need root, iproute2,
// debootstrap, tinyproxy, git and Debian's ansible; they fail, never skip,
// when something is missing.
package tests

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/internal/playbook"
	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
)

// requireTools fails the test unless it runs as root with every tool it needs.
func requireTools(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the Ansible tests need root (mounts, network namespaces, debootstrap); run them as root")
	}
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("missing tools: %s; install them with scripts/services.sh deps", strings.Join(missing, ", "))
	}
}

var targetTools = []string{"ansible-playbook", "debootstrap", "tinyproxy", "ip", "chroot", "git", "ssh"}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := target.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func ansibleDir(t testing.TB) string {
	return filepath.Join(repoRoot(t), "ansible")
}

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

var (
	imageOnce sync.Once
	imageVal  *target.Image
	imageErr  error
)

// sharedImage builds (once per process, cached on disk) the target image.
func sharedImage(t testing.TB) *target.Image {
	t.Helper()
	imageOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		imageVal, imageErr = target.EnsureImage(ctx, target.ImageConfig{
			CacheDir: filepath.Join(repoRoot(t), ".cache", "testtarget"),
			Progress: prefixWriter{prefix: "image: "},
		})
	})
	if imageErr != nil {
		t.Fatalf("test target image: %v", imageErr)
	}
	return imageVal
}

// prefixWriter shows build progress on stderr while the test runs.
type prefixWriter struct{ prefix string }

func (w prefixWriter) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line != "" {
			fmt.Fprint(os.Stderr, w.prefix+line)
		}
	}
	return len(p), nil
}

// testAgent is an in-process ssh-agent holding one ed25519 key, served on a
// unix socket, as the infra service hands keys to ansible-playbook.
type testAgent struct {
	Sock    string
	PubLine string
	keyring agent.Agent
}

func newAgent(t testing.TB) *testAgent {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kr := agent.NewKeyring()
	if err := kr.Add(agent.AddedKey{PrivateKey: priv, Comment: "autoprov-test"}); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "apag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _ = agent.ServeAgent(kr, c) }()
		}
	}()
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))) + " autoprov-test"
	return &testAgent{Sock: sock, PubLine: line, keyring: kr}
}

// sshRun logs in to the target as user with the agent's key (pinning the
// host key) and runs cmd.
func (a *testAgent) sshRun(tgt *target.Target, user, cmd string) (string, error) {
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tgt.HostKey))
	if err != nil {
		return "", err
	}
	signers, err := a.keyring.Signers()
	if err != nil {
		return "", err
	}
	client, err := ssh.Dial("tcp", net.JoinHostPort(tgt.Addr, fmt.Sprint(tgt.Port)), &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signers...)},
		HostKeyCallback:   ssh.FixedHostKey(hostKey),
		HostKeyAlgorithms: []string{hostKey.Type()},
		Timeout:           10 * time.Second,
	})
	if err != nil {
		return "", err
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

type targetOpts struct {
	rootSizeMB int
	noPkgCache bool
	extraKeys  []string
}

// startTarget starts a fresh target reachable with the agent's key as root;
// it is stopped when the test ends.
func startTarget(t testing.TB, a *testAgent, o targetOpts) *target.Target {
	t.Helper()
	img := sharedImage(t)
	cache := filepath.Join(repoRoot(t), ".cache", "testtarget", "debs")
	if o.noPkgCache {
		cache = ""
	}
	dir, err := os.MkdirTemp("", "aptgt")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tgt, err := target.Start(ctx, img, target.Options{
		Dir:            dir,
		AuthorizedKeys: append([]string{a.PubLine}, o.extraKeys...),
		RootSizeMB:     o.rootSizeMB,
		PackageCache:   cache,
		Logger:         testLogger(t),
	})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start target: %v", err)
	}
	t.Cleanup(func() {
		if err := tgt.Stop(); err != nil {
			t.Errorf("stop target: %v", err)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove target dir: %v", err)
		}
	})
	return tgt
}

// hostFor is the inventory host for a target, logging in as user.
func hostFor(tgt *target.Target, user string) playbook.Host {
	return playbook.Host{
		Alias: "srv-test", Addr: tgt.Addr, Port: tgt.Port, User: user,
		KnownHosts: tgt.KnownHostsLine() + "\n",
	}
}

// runPlaybook runs a playbook and returns its result; the run directory is
// shared by the runs of one test (same fact cache, like infra's per-server cache).
func runPlaybook(t testing.TB, r playbook.Run) *playbook.Result {
	t.Helper()
	if r.AnsibleDir == "" {
		r.AnsibleDir = ansibleDir(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	res, err := playbook.Execute(ctx, r)
	if err != nil {
		t.Fatalf("%s: %v", r.Playbook, err)
	}
	t.Logf("%s: exit %d in %s", r.Playbook, res.ExitCode, res.Duration.Round(time.Millisecond))
	return res
}

// mustSucceed fails the test unless the run exited 0 without failed hosts.
func mustSucceed(t testing.TB, res *playbook.Result, host string) playbook.HostStats {
	t.Helper()
	if res.ExitCode != 0 {
		t.Fatalf("playbook failed: %s", res.Summary())
	}
	st, ok := res.Stats(host)
	if !ok {
		t.Fatalf("no stats event for %s: %s", host, res.Summary())
	}
	if st.Failed > 0 || st.Unreachable > 0 {
		t.Fatalf("stats %+v: %s", st, res.Summary())
	}
	return st
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(data)
}

func fileMode(t testing.TB, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Mode().Perm()
}

// dpkgInstalled reports whether a package is installed in the target.
func dpkgInstalled(t testing.TB, tgt *target.Target, pkg string) bool {
	t.Helper()
	status := readFile(t, tgt.Path("/var/lib/dpkg/status"))
	for _, block := range strings.Split(status, "\n\n") {
		if strings.HasPrefix(block, "Package: "+pkg+"\n") {
			return strings.Contains(block, "\nStatus: install ok installed")
		}
	}
	return false
}

func newRunDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "aprun")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
