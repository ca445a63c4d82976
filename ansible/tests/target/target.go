package target

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// ProxyPort is the port of the apt proxy on the host end of each target's veth.
const ProxyPort = 3142

// Options configures a target.
type Options struct {
	// Dir is the target's own directory (created if missing): overlay layers,
	// the merged root, logs and the proxy configuration. Must be absolute.
	Dir string
	// AuthorizedKeys are installed as root's authorized_keys (at least one).
	AuthorizedKeys []string
	// RootSizeMB, when above 0, puts the writable layer on a tmpfs of that
	// size, so the target's "/" reports that size (for disk-full tests).
	RootSizeMB int
	// PackageCache is a directory of .deb files shared between targets: they
	// are seeded into the target's apt cache at start and the ones the target
	// downloaded are added back at Stop. Empty disables it.
	PackageCache string
	// Logger receives the target's lifecycle messages.
	Logger zerolog.Logger
}

// Target is a running test target. Its exported fields describe how to reach it.
type Target struct {
	// Name is the target's network namespace.
	Name string
	// Addr is the target's address (reachable from the test machine).
	Addr string
	// HostAddr is the test machine's address on the target's veth: services
	// for the target (the apt proxy, test servers) listen there.
	HostAddr string
	// Port is sshd's port.
	Port int
	// User is the user whose authorized_keys hold Options.AuthorizedKeys.
	User string
	// HostKey is sshd's ed25519 public key ("ssh-ed25519 AAAA...").
	HostKey string
	// Dir is the target's directory.
	Dir string
	// Root is the target's root file system as seen from the test machine.
	Root string
	// Upper is the overlay's writable layer: every file the target changed.
	Upper string
	// ProxyURL is the apt proxy the target uses.
	ProxyURL string

	log      zerolog.Logger
	entry    *entry
	opts     Options
	sshd     *exec.Cmd
	proxy    *exec.Cmd
	stopOnce sync.Once
	stopErr  error
}

// KnownHostsLine returns the known_hosts line pinning the target's host key.
func (t *Target) KnownHostsLine() string {
	host := t.Addr
	if t.Port != 22 {
		host = fmt.Sprintf("[%s]:%d", t.Addr, t.Port)
	}
	return host + " " + t.HostKey
}

// Path returns where a path inside the target lives on the test machine.
func (t *Target) Path(p string) string {
	return filepath.Join(t.Root, filepath.Clean("/"+p))
}

// Command returns a command running argv inside the target (its network
// namespace and root), as root.
func (t *Target) Command(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"netns", "exec", t.Name, "chroot", t.Root}, argv...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "HOME=/root"}
	return cmd
}

// Run runs argv inside the target and returns its combined output.
func (t *Target) Run(ctx context.Context, argv ...string) ([]byte, error) {
	out, err := t.Command(ctx, argv...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("run %v in %s: %w: %s", argv, t.Name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// Start starts a fresh target from img: a copy-on-write copy of the image,
// its own network namespace and veth pair, an apt proxy on the host end and
// sshd inside. Stop undoes all of it; a crashed run's leftovers are removed
// by the next Start (CleanupStale).
func Start(ctx context.Context, img *Image, opts Options) (_ *Target, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("start test target: needs root (mounts, network namespaces)")
	}
	if err := requireTools("ip", "chroot", "tinyproxy"); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("start test target: dir %q is not absolute", opts.Dir)
	}
	if len(opts.AuthorizedKeys) == 0 {
		return nil, errors.New("start test target: no authorized key")
	}
	if err := CleanupStale(ctx, opts.Logger); err != nil {
		opts.Logger.Warn().Err(err).Msg("cleaning up stale test targets")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", opts.Dir, err)
	}
	root := filepath.Join(opts.Dir, "root")
	e, err := acquireSlot(opts.Dir, root)
	if err != nil {
		return nil, err
	}
	netns, hostVeth, peerVeth, hostAddr, addr := slotNames(e.Slot)
	t := &Target{
		Name: netns, Addr: addr, HostAddr: hostAddr, Port: 22, User: "root",
		Dir: opts.Dir, Root: root,
		ProxyURL: fmt.Sprintf("http://%s:%d/", hostAddr, ProxyPort),
		log:      opts.Logger.With().Str("target", netns).Logger(),
		entry:    e, opts: opts,
	}
	defer func() {
		if err != nil {
			if serr := t.Stop(); serr != nil {
				t.log.Error().Err(serr).Msg("cleaning up a target that failed to start")
			}
		}
	}()
	start := time.Now()
	if err := t.mountRoot(img); err != nil {
		return nil, err
	}
	if err := t.prepareRoot(ctx); err != nil {
		return nil, err
	}
	if err := t.setupNetwork(ctx, netns, hostVeth, peerVeth); err != nil {
		return nil, err
	}
	if err := t.startProxy(ctx); err != nil {
		return nil, err
	}
	if err := t.startSSHD(ctx); err != nil {
		return nil, err
	}
	if err := t.writeInfo(); err != nil {
		return nil, err
	}
	t.log.Info().Str("addr", addr).Dur("took", time.Since(start)).Msg("test target up")
	return t, nil
}

func (t *Target) mountRoot(img *Image) error {
	layer := t.Dir
	if t.opts.RootSizeMB > 0 {
		layer = filepath.Join(t.Dir, "layer")
		if err := os.MkdirAll(layer, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("tmpfs", layer, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV,
			fmt.Sprintf("size=%dm,mode=0755", t.opts.RootSizeMB)); err != nil {
			return fmt.Errorf("mount tmpfs layer: %w", err)
		}
	}
	t.Upper = filepath.Join(layer, "upper")
	work := filepath.Join(layer, "work")
	for _, d := range []string{t.Upper, work, t.Root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := t.seedPackages(); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", img.Dir, t.Upper, work)
	if err := syscall.Mount("overlay", t.Root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", t.Root, err)
	}
	mounts := []struct{ src, dir, fstype, data string }{
		{"proc", "proc", "proc", ""},
		{"devpts", "dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"tmpfs", "dev/shm", "tmpfs", "size=64m,mode=1777"},
	}
	for _, m := range mounts {
		dir := filepath.Join(t.Root, m.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(m.src, dir, m.fstype, syscall.MS_NOSUID|syscall.MS_NOEXEC, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, dir, err)
		}
	}
	// The new devpts instance needs /dev/ptmx to point into it.
	ptmx := filepath.Join(t.Root, "dev/ptmx")
	_ = os.Remove(ptmx)
	if err := os.Symlink("pts/ptmx", ptmx); err != nil {
		return fmt.Errorf("link /dev/ptmx: %w", err)
	}
	return nil
}

// seedPackages copies (hard-links) the shared .deb cache into the writable
// layer before the overlay is mounted.
func (t *Target) seedPackages() error {
	if t.opts.PackageCache == "" {
		return nil
	}
	if err := os.MkdirAll(t.opts.PackageCache, 0o755); err != nil {
		return fmt.Errorf("create package cache: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(t.opts.PackageCache, "*.deb"))
	if len(debs) == 0 {
		return nil
	}
	dst := filepath.Join(t.Upper, "var/cache/apt/archives")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, d := range debs {
		if err := linkOrCopy(d, filepath.Join(dst, filepath.Base(d))); err != nil {
			return fmt.Errorf("seed %s: %w", filepath.Base(d), err)
		}
	}
	return nil
}

// harvestPackages adds the .deb files the target downloaded to the shared cache.
func (t *Target) harvestPackages() error {
	if t.opts.PackageCache == "" || t.Upper == "" {
		return nil
	}
	debs, _ := filepath.Glob(filepath.Join(t.Upper, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		dst := filepath.Join(t.opts.PackageCache, filepath.Base(d))
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		if err := linkOrCopy(d, dst); err != nil {
			return fmt.Errorf("keep %s: %w", filepath.Base(d), err)
		}
	}
	return nil
}

func (t *Target) prepareRoot(ctx context.Context) error {
	keys, _ := filepath.Glob(t.Path("/etc/ssh/ssh_host_*"))
	for _, k := range keys {
		_ = os.Remove(k)
	}
	if out, err := exec.CommandContext(ctx, "chroot", t.Root, "/usr/bin/ssh-keygen", "-A").CombinedOutput(); err != nil {
		return fmt.Errorf("generate host keys: %w: %s", err, out)
	}
	pub, err := os.ReadFile(t.Path("/etc/ssh/ssh_host_ed25519_key.pub"))
	if err != nil {
		return fmt.Errorf("read host key: %w", err)
	}
	f := strings.Fields(string(pub))
	if len(f) < 2 {
		return fmt.Errorf("read host key: malformed %q", pub)
	}
	t.HostKey = f[0] + " " + f[1]

	if err := os.MkdirAll(t.Path("/root/.ssh"), 0o700); err != nil {
		return err
	}
	keysData := strings.Join(t.opts.AuthorizedKeys, "\n") + "\n"
	if err := os.WriteFile(t.Path("/root/.ssh/authorized_keys"), []byte(keysData), 0o600); err != nil {
		return fmt.Errorf("write authorized_keys: %w", err)
	}
	// The target shares the test machine's host name (UTS namespace): make it
	// resolvable as on a real server, or sudo complains on every call.
	hostname, _ := os.Hostname()
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", hostname)
	if err := os.WriteFile(t.Path("/etc/hosts"), []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("write /etc/hosts: %w", err)
	}
	if err := os.MkdirAll(t.Path("/run/sshd"), 0o755); err != nil {
		return err
	}
	proxy := fmt.Sprintf("// autoprovisioner test target: the only way out is the proxy on the host.\n"+
		"Acquire::http::Proxy %q;\nAcquire::https::Proxy %q;\n", t.ProxyURL, t.ProxyURL)
	if err := os.WriteFile(t.Path("/etc/apt/apt.conf.d/01autoprov-test-proxy"), []byte(proxy), 0o644); err != nil {
		return fmt.Errorf("write apt proxy config: %w", err)
	}
	return nil
}

func (t *Target) setupNetwork(ctx context.Context, netns, hostVeth, peerVeth string) error {
	steps := [][]string{
		{"netns", "add", netns},
		{"link", "add", hostVeth, "type", "veth", "peer", "name", peerVeth, "netns", netns},
		{"addr", "add", t.HostAddr + "/30", "dev", hostVeth},
		{"link", "set", hostVeth, "up"},
		{"-n", netns, "link", "set", "lo", "up"},
		{"-n", netns, "link", "set", peerVeth, "name", "eth0"},
		{"-n", netns, "addr", "add", t.Addr + "/30", "dev", "eth0"},
		{"-n", netns, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := run(ctx, "ip", s...); err != nil {
			return fmt.Errorf("set up the target network: %w", err)
		}
	}
	return nil
}

func (t *Target) startProxy(ctx context.Context) error {
	conf := filepath.Join(t.Dir, "tinyproxy.conf")
	text := fmt.Sprintf(`# apt proxy of test target %s (started by the harness, not a system service)
User nobody
Group nogroup
Port %d
Listen %s
Allow %s
Timeout 600
MaxClients 64
LogLevel Notice
ConnectPort 443
`, t.Name, ProxyPort, t.HostAddr, t.Addr)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write proxy config: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(t.Dir, "tinyproxy.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("tinyproxy", "-d", "-c", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start tinyproxy: %w", err)
	}
	t.proxy = cmd
	go func() { _ = cmd.Wait() }()
	t.entry.ProxyPid, t.entry.ProxyConf = cmd.Process.Pid, conf
	if err := t.entry.save(); err != nil {
		return err
	}
	return waitTCP(ctx, net.JoinHostPort(t.HostAddr, strconv.Itoa(ProxyPort)), 10*time.Second, nil)
}

func (t *Target) startSSHD(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(t.Dir, "sshd.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("ip", "netns", "exec", t.Name, "chroot", t.Root, "/usr/sbin/sshd", "-D", "-e")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start sshd: %w", err)
	}
	t.sshd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	addr := net.JoinHostPort(t.Addr, strconv.Itoa(t.Port))
	if err := waitTCP(ctx, addr, 15*time.Second, exited); err != nil {
		log, _ := os.ReadFile(filepath.Join(t.Dir, "sshd.log"))
		return fmt.Errorf("sshd: %w: %s", err, bytes.TrimSpace(log))
	}
	return nil
}

// waitTCP waits until addr accepts connections and sends a first line.
func waitTCP(ctx context.Context, addr string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering after %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("exited before listening on %s", addr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Info is the JSON description of a running target (target.json in its directory).
type Info struct {
	Name       string `json:"name"`
	Addr       string `json:"addr"`
	HostAddr   string `json:"host_addr"`
	Port       int    `json:"port"`
	User       string `json:"user"`
	HostKey    string `json:"host_key"`
	KnownHosts string `json:"known_hosts_line"`
	Dir        string `json:"dir"`
	Root       string `json:"root"`
	Upper      string `json:"upper"`
	ProxyURL   string `json:"proxy_url"`
	OwnerPid   int    `json:"owner_pid"`
}

// Info returns the JSON description of the target.
func (t *Target) Info() Info {
	return Info{
		Name: t.Name, Addr: t.Addr, HostAddr: t.HostAddr, Port: t.Port, User: t.User,
		HostKey: t.HostKey, KnownHosts: t.KnownHostsLine(), Dir: t.Dir, Root: t.Root,
		Upper: t.Upper, ProxyURL: t.ProxyURL, OwnerPid: os.Getpid(),
	}
}

func (t *Target) writeInfo() error {
	data, err := json.MarshalIndent(t.Info(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(t.Dir, "target.json"), append(data, '\n'), 0o644)
}

// Stop stops every process of the target (sshd, the proxy and anything
// started inside), keeps newly downloaded packages in the shared cache,
// unmounts the root and deletes the veth pair and the network namespace.
// The target's directory stays. Safe to call more than once.
func (t *Target) Stop() error {
	t.stopOnce.Do(func() {
		var errs []error
		if err := t.harvestPackages(); err != nil {
			errs = append(errs, err)
		}
		for _, c := range []*exec.Cmd{t.sshd, t.proxy} {
			if c != nil && c.Process != nil {
				_ = c.Process.Kill()
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := t.entry.release(ctx); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(filepath.Join(t.Dir, "target.json"))
		t.stopErr = errors.Join(errs...)
		if t.stopErr == nil {
			t.log.Info().Msg("test target stopped")
		}
	})
	return t.stopErr
}
