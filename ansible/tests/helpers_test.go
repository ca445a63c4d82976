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
	"encoding/pem"
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

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
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

// testKey is an ed25519 client key. The runner serves it to ssh from its
// in-process agent (Spec.SSHKeys), as the infra service serves its keys;
// sshRun logs in with it too.
type testKey struct {
	PEM     []byte
	PubLine string
	signer  ssh.Signer
}

func newKey(t testing.TB) *testKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "autoprov-test")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))) + " autoprov-test"
	return &testKey{PEM: pem.EncodeToMemory(block), PubLine: line, signer: signer}
}

// sshRun logs in to the target as user with the key (pinning the host key)
// and runs cmd.
func (k *testKey) sshRun(tgt *target.Target, user, cmd string) (string, error) {
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tgt.HostKey))
	if err != nil {
		return "", err
	}
	client, err := ssh.Dial("tcp", net.JoinHostPort(tgt.Addr, fmt.Sprint(tgt.Port)), &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(k.signer)},
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

// startTarget starts a fresh target reachable with the key as root; it is
// stopped when the test ends.
func startTarget(t testing.TB, k *testKey, o targetOpts) *target.Target {
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
		AuthorizedKeys: append([]string{k.PubLine}, o.extraKeys...),
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

// hostFor is the host of a run against a target, logging in as user.
func hostFor(tgt *target.Target, user string) ansible.Host {
	return ansible.Host{Alias: "srv-test", Address: tgt.Addr, Port: tgt.Port, User: user, KnownHostsKey: tgt.HostKey}
}

// guard is the runguard binary the infra service runs every play under,
// built once per test process.
var guard = testenv.NewBuilds("ansible-tests-runguard-",
	testenv.Build{Name: "runguard", Pkg: "github.com/autoprovisioner/autoprovisioner/pkg/ansible/cmd/runguard", Static: true})

// TestMain removes the runguard binary the tests built: a test process
// leaves nothing behind in the temp dir.
func TestMain(m *testing.M) {
	code := m.Run()
	guard.Close()
	os.Exit(code)
}

// runguard returns the runguard binary (built once per test process).
func runguard(t testing.TB) string { return guard.Path(t, "runguard") }

// newRunner returns the infra service's playbook runner (package
// pkg/ansible, under runguard, with infra's default limits) over ansibleDir,
// with a run root and a fact cache of the test's own: the runs of one test
// share the cache, as infra's runs on one server do. Its output tail is
// large enough to hold a whole run.
func newRunner(t testing.TB, ansibleDir string) *ansible.Runner {
	t.Helper()
	runRoot, err := os.MkdirTemp("", "aprun") // short: it holds unix sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runRoot) })
	r, err := ansible.New(ansible.Config{
		AnsibleDir:   ansibleDir,
		PlaybookBin:  "/usr/bin/ansible-playbook",
		RunRoot:      runRoot,
		GuardPath:    runguard(t),
		FactCacheDir: filepath.Join(runRoot, "facts"),
		KillGrace:    10 * time.Second,
		Timeout:      15 * time.Minute,
		IdleTimeout:  10 * time.Minute,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Guarded() {
		t.Fatal("the runner does not use runguard")
	}
	return r
}

// play is one playbook run and what it produced.
type play struct {
	*ansible.Result
	// Events are the callback events, in order; Output every line of
	// stdout and stderr (the Result's tail holds only the end).
	Events   []ansible.Event
	Output   string
	Duration time.Duration
}

// runPlay runs spec through r, unredacted (the tests look for leaks
// themselves), and fails the test if it could not start.
func runPlay(t testing.TB, r *ansible.Runner, spec ansible.Spec) *play {
	t.Helper()
	if spec.JobID == "" {
		spec.JobID = "test-" + strings.TrimSuffix(spec.Playbook, ".yml")
	}
	p := &play{}
	var mu sync.Mutex
	var out strings.Builder
	spec.OnEvent = func(ev ansible.Event) { mu.Lock(); p.Events = append(p.Events, ev); mu.Unlock() }
	spec.OnOutput = func(line string) { mu.Lock(); out.WriteString(line + "\n"); mu.Unlock() }
	res, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatalf("%s: %v", spec.Playbook, err)
	}
	mu.Lock()
	defer mu.Unlock()
	p.Result, p.Output, p.Duration = res, out.String(), res.FinishedAt.Sub(res.StartedAt)
	t.Logf("%s: %s (exit %d) in %s", spec.Playbook, res.Outcome, res.ExitCode, p.Duration.Round(time.Millisecond))
	return p
}

// Stats returns the stats event's recap of host (ok=false without one).
func (p *play) Stats(host string) (ansible.Recap, bool) {
	for i := len(p.Events) - 1; i >= 0; i-- {
		if p.Events[i].Type == ansible.EventStats {
			s, ok := p.Events[i].Stats[host]
			return s, ok
		}
	}
	return ansible.Recap{}, false
}

// Changed lists the names of the tasks that reported a change.
func (p *play) Changed() []string {
	var out []string
	for _, e := range p.Events {
		if e.Type == ansible.EventHostOK && e.Changed {
			out = append(out, e.Task)
		}
	}
	return out
}

// Failures lists the failed or unreachable task results (task: msg).
func (p *play) Failures() []string {
	var out []string
	for _, e := range p.Events {
		if (e.Type == ansible.EventHostFailed && !e.IgnoreErrors) || e.Type == ansible.EventHostUnreachable {
			out = append(out, e.Task+": "+e.Msg)
		}
	}
	return out
}

// EventText is all the text of the events (for leak checks).
func (p *play) EventText() string {
	var b strings.Builder
	for _, e := range p.Events {
		for _, s := range []string{e.Playbook, e.Play, e.Task, e.Action, e.Host, e.Msg} {
			b.WriteString(s + "\n")
		}
		for h := range e.Stats {
			b.WriteString(h + "\n")
		}
	}
	return b.String()
}

// Summary is a short description for test failure messages.
func (p *play) Summary() string {
	tail := p.Output
	if len(tail) > 6000 {
		tail = "..." + tail[len(tail)-6000:]
	}
	return fmt.Sprintf("%s, exit %d after %s: %v\nfailures: %v\noutput tail:\n%s",
		p.Outcome, p.ExitCode, p.Duration.Round(time.Millisecond), p.Err, p.Failures(), tail)
}

// mustSucceed fails the test unless the run succeeded (exit 0, no failed
// or unreachable host) with a stats event for host.
func mustSucceed(t testing.TB, p *play, host string) ansible.Recap {
	t.Helper()
	if p.Outcome != ansible.OutcomeSucceeded || p.ExitCode != 0 {
		t.Fatalf("playbook failed: %s", p.Summary())
	}
	st, ok := p.Stats(host)
	if !ok {
		t.Fatalf("no stats event for %s: %s", host, p.Summary())
	}
	if st.Failed > 0 || st.Unreachable > 0 {
		t.Fatalf("stats %+v: %s", st, p.Summary())
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
