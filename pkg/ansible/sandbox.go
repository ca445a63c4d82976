package ansible

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Sandbox contains every run (Config.Sandbox) with bubblewrap: the run's
// ansible-playbook and everything it starts see a mount namespace of their
// own (the system's read-only files, Ansible, the run's private directory
// and, for a job, its read-only checkout; nothing of the service's), a PID
// namespace of their own (no other process is visible, and all of them die
// with the play) and their own IPC and UTS namespaces. The network is the
// host's: plays connect to their targets.
//
// With the service running as root, a job runs as a user id of UIDs that
// no concurrent run on this machine holds (leased through a flock in
// autoprov-uids next to RunRoot, so replicas sharing RunRoot's parent share
// the range safely);
// the fleet's own runs (Run: provisioning and deploys, the operator's
// playbooks) run as Config.RunAs, the user of the warm connections, or as
// root when it is unset. Without root, every run runs as the service's user,
// still in namespaces of its own.
type Sandbox struct {
	// Bwrap is the absolute path of bubblewrap (/usr/bin/bwrap).
	Bwrap string
	// UIDs are the user (and group) ids of job runs; needed when the
	// service runs as root. No account of this machine may use one.
	UIDs UIDRange
	// Writable are directories the fleet's own runs (never jobs) may
	// write to on this machine, e.g. where plays leave artifacts.
	Writable []string
}

// UIDRange is First, First+1, ..., First+Count-1.
type UIDRange struct{ First, Count uint32 }

// ParseUIDRange reads "FIRST-LAST" (inclusive).
func ParseUIDRange(s string) (UIDRange, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	lo, err1 := strconv.ParseUint(a, 10, 32)
	hi, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || hi < lo || lo == 0 {
		return UIDRange{}, fmt.Errorf("%q: want FIRST-LAST, e.g. 40000-40999 (ids above 0, FIRST <= LAST)", s)
	}
	return UIDRange{First: uint32(lo), Count: uint32(hi-lo) + 1}, nil
}

func (u UIDRange) String() string {
	return fmt.Sprintf("%d-%d", u.First, u.First+u.Count-1)
}

func (u UIDRange) contains(id uint32) bool { return id >= u.First && id-u.First < u.Count }

// sandbox is the runner's side of Config.Sandbox.
type sandbox struct {
	bwrap   string
	uids    UIDRange // Count 0: runs keep the service's uid (not root)
	lockDir string   // flocked lease files, one per uid
	next    atomic.Uint32
	etc     []string // the /etc entries bound read-only
	shared  []mount  // what every run sees: ansible.cfg's own paths
	fleet   []mount  // what the fleet's runs see besides
}

// uidLease is a job run's user id, held while its flock is.
type uidLease struct {
	cred Credential
	f    *os.File
}

func (l *uidLease) release() {
	if l != nil && l.f != nil {
		_ = l.f.Close()
	}
}

// etcEntries are the files of /etc a play needs (name resolution, TLS
// roots, the dynamic loader, ssh's and Python's own); nothing else of /etc
// is visible. /etc/passwd and /etc/group are the run's own (two lines).
var etcEntries = []string{
	"hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf", "services", "protocols",
	"ssl", "ca-certificates", "ca-certificates.conf", "localtime", "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
	"alternatives", "ssh/ssh_config", "ssh/ssh_config.d", "ansible", "os-release", "debian_version", "mime.types",
}

// newSandbox checks cfg.Sandbox against the machine.
func newSandbox(cfg Config) (*sandbox, error) {
	sb := cfg.Sandbox
	if err := checkExecutable(sb.Bwrap); err != nil {
		return nil, fmt.Errorf("ansible runner: Sandbox.Bwrap: %w", err)
	}
	s := &sandbox{bwrap: sb.Bwrap, lockDir: filepath.Join(filepath.Dir(cfg.RunRoot), "autoprov-uids")}
	if os.Geteuid() == 0 {
		if sb.UIDs.Count == 0 {
			return nil, errors.New("ansible runner: Sandbox.UIDs must name the user ids of job runs when the service runs as root")
		}
		if sb.UIDs.First+sb.UIDs.Count-1 < sb.UIDs.First {
			return nil, errors.New("ansible runner: Sandbox.UIDs overflows")
		}
		if cfg.RunAs != nil && sb.UIDs.contains(cfg.RunAs.UID) {
			return nil, fmt.Errorf("ansible runner: Sandbox.UIDs %s holds RunAs's uid %d: job runs must never share the fleet's user", sb.UIDs, cfg.RunAs.UID)
		}
		if name, id, ok := accountIn(sb.UIDs); ok {
			return nil, fmt.Errorf("ansible runner: Sandbox.UIDs %s holds the account %s (uid %d): pick ids no account uses", sb.UIDs, name, id)
		}
		s.uids = sb.UIDs
		if err := os.MkdirAll(s.lockDir, 0o700); err != nil {
			return nil, fmt.Errorf("ansible runner: sandbox leases: %w", err)
		}
	} else if sb.UIDs.Count > 0 {
		return nil, errors.New("ansible runner: Sandbox.UIDs needs the service to run as root (without root every run keeps its user)")
	}
	for _, e := range etcEntries {
		if _, err := os.Stat(filepath.Join("/etc", e)); err == nil {
			s.etc = append(s.etc, e)
		}
	}
	s.shared = append([]mount{{path: cfg.AnsibleDir}}, configPaths(cfg.AnsibleDir)...)
	s.fleet = []mount{{path: cfg.FactCacheDir, writable: true}}
	for _, w := range sb.Writable {
		if !filepath.IsAbs(w) {
			return nil, fmt.Errorf("ansible runner: Sandbox.Writable %q is not an absolute path", w)
		}
		if st, err := os.Stat(w); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("ansible runner: Sandbox.Writable %s is not a directory", w)
		}
		s.fleet = append(s.fleet, mount{path: filepath.Clean(w), writable: true})
	}
	return s, nil
}

// configPathKeys are the settings of ansible.cfg that name directories of
// content Ansible loads.
var configPathKeys = map[string]bool{
	"roles_path": true, "library": true, "module_utils": true, "collections_path": true, "collections_paths": true,
	"action_plugins": true, "become_plugins": true, "cache_plugins": true, "callback_plugins": true,
	"cliconf_plugins": true, "connection_plugins": true, "doc_fragment_plugins": true, "filter_plugins": true,
	"httpapi_plugins": true, "inventory_plugins": true, "lookup_plugins": true, "netconf_plugins": true,
	"strategy_plugins": true, "terminal_plugins": true, "test_plugins": true, "vars_plugins": true,
}

// configPaths are the existing directories outside dir that dir's
// ansible.cfg loads content from: the sandbox shows them read-only.
func configPaths(dir string) []mount {
	data, err := os.ReadFile(filepath.Join(dir, "ansible.cfg"))
	if err != nil {
		return nil
	}
	var out []mount
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !configPathKeys[strings.TrimSpace(k)] {
			continue
		}
		for _, p := range filepath.SplitList(strings.TrimSpace(v)) {
			if p == "" || strings.HasPrefix(p, "~") {
				continue
			}
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			p = filepath.Clean(p)
			if within(dir, p) {
				continue
			}
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				out = append(out, mount{path: p})
			}
		}
	}
	return out
}

// accountIn finds an account of /etc/passwd whose uid is in r.
func accountIn(r UIDRange) (string, uint32, bool) {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return "", 0, false
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Split(line, ":")
		if len(f) < 3 {
			continue
		}
		if id, err := strconv.ParseUint(f[2], 10, 32); err == nil && r.contains(uint32(id)) {
			return f[0], uint32(id), true
		}
	}
	return "", 0, false
}

// lease takes a user id no other run holds.
func (s *sandbox) lease() (*uidLease, error) {
	start := s.next.Add(1)
	for i := range s.uids.Count {
		id := s.uids.First + (start+i)%s.uids.Count
		f, err := os.OpenFile(filepath.Join(s.lockDir, strconv.FormatUint(uint64(id), 10)), os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("sandbox lease: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return &uidLease{cred: Credential{UID: id, GID: id}, f: f}, nil
	}
	return nil, fmt.Errorf("sandbox: all %d user ids of %s are held by running jobs", s.uids.Count, s.uids)
}

// runIdentity is who a run runs as: the job's lease, the fleet's RunAs, or
// (nil) the service's own user.
func (r *Runner) runIdentity(job bool) (*Credential, *uidLease, error) {
	if job && r.sandbox != nil && r.sandbox.uids.Count > 0 {
		l, err := r.sandbox.lease()
		if err != nil {
			return nil, nil, err
		}
		return &l.cred, l, nil
	}
	return r.cfg.RunAs, nil, nil
}

// Sandboxed tells whether runs are sandboxed (Config.Sandbox).
func (r *Runner) Sandboxed() bool { return r.sandbox != nil }

// RunsAsOthers tells whether plays run as other users than this process
// (Config.RunAs, or the job user ids of a sandbox): what they read must be
// reachable to those users.
func (r *Runner) RunsAsOthers() bool {
	return r.cfg.RunAs != nil || (r.sandbox != nil && r.sandbox.uids.Count > 0)
}

// ownUID tells whether a run directory owned by uid may be one of this
// runner's (SweepLeftovers).
func (r *Runner) ownUID(uid uint32) bool {
	switch {
	case int(uid) == os.Geteuid():
		return true
	case r.cfg.RunAs != nil && uid == r.cfg.RunAs.UID:
		return true
	case r.sandbox != nil && r.sandbox.uids.contains(uid):
		return true
	}
	return false
}

// mount is one bind of a run's sandbox.
type mount struct {
	path     string
	writable bool
}

// wrap returns argv run in the sandbox of rd with the given binds besides
// the run directory (at their own paths).
// base is the start of every sandbox's command line: its namespaces as
// user uid:gid, the system's programs and libraries read-only, and fresh
// /proc, /dev and temp dirs.
func (s *sandbox) base(uid, gid uint32) []string {
	// The host name stays: ssh's ControlPath (%C) hashes it, and the
	// fleet's runs find their warm master by it.
	out := []string{s.bwrap,
		"--unshare-user", "--uid", strconv.FormatUint(uint64(uid), 10), "--gid", strconv.FormatUint(uint64(gid), 10),
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--disable-userns", "--die-with-parent",
		"--ro-bind", "/usr", "/usr",
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		p := "/" + d
		if t, err := os.Readlink(p); err == nil {
			out = append(out, "--symlink", t, p)
		} else if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, "--ro-bind", p, p)
		}
	}
	return append(out, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--dir", "/run")
}

func (s *sandbox) wrap(rd *runDir, binds []mount, argv []string) ([]string, error) {
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	if rd.owner != nil {
		uid, gid = rd.owner.UID, rd.owner.GID
	}
	// The run's own account database: its user and root, nobody else.
	name := "play"
	if uid == 0 {
		name = "root"
	}
	passwd := filepath.Join(rd.path, "passwd")
	group := filepath.Join(rd.path, "group")
	pw := "root:x:0:0:root:/root:/usr/sbin/nologin\n"
	gr := "root:x:0:\n"
	if uid != 0 {
		pw += fmt.Sprintf("%s:x:%d:%d:autoprovisioner play:%s:/bin/sh\n", name, uid, gid, rd.path)
	}
	if gid != 0 {
		gr += fmt.Sprintf("%s:x:%d:\n", name, gid)
	}
	for _, f := range []struct{ path, text string }{{passwd, pw}, {group, gr}} {
		if err := writeFile(f.path, []byte(f.text)); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		if err := os.Chmod(f.path, 0o444); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	out := s.base(uid, gid)
	for _, e := range s.etc {
		out = append(out, "--ro-bind", "/etc/"+e, "/etc/"+e)
	}
	if py, _ := filepath.Glob("/etc/python3*"); len(py) > 0 {
		for _, p := range py {
			out = append(out, "--ro-bind", p, p)
		}
	}
	out = append(out, "--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group")
	seen := []string{rd.path}
	out = append(out, "--bind", rd.path, rd.path)
	for _, m := range binds {
		if m.path == "" || slices.Contains(seen, m.path) {
			continue
		}
		seen = append(seen, m.path)
		if m.writable {
			out = append(out, "--bind", m.path, m.path)
		} else {
			out = append(out, "--ro-bind", m.path, m.path)
		}
	}
	out = append(out, "--chdir", rd.tmpDir, "--")
	return append(out, argv...), nil
}

// JobCommand is argv (an absolute program, e.g. ansible-inventory) made to
// run as a job's play would: with a sandbox, as a user id of its own in a
// sandbox of its own that shows dir (the job's directory, writable, handed
// to that user) besides what every run sees; without one, as RunAs (or
// this process's user). env is the command's whole environment; the
// caller sets Stdout, Stderr and Dir (dir's own path) and runs it, then
// calls done, which removes what the command's sandbox needed.
func (r *Runner) JobCommand(ctx context.Context, dir string, argv, env []string) (*exec.Cmd, func(), error) {
	if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
		return nil, nil, errors.New("job command: want an absolute program")
	}
	rd, err := r.newRunDir("command", true)
	if err != nil {
		return nil, nil, err
	}
	done := func() {
		if err := rd.remove(); err != nil {
			r.log.Error().Err(err).Msg("remove run dir")
		}
	}
	if err := rd.handOver(dir); err != nil {
		done()
		return nil, nil, err
	}
	if r.sandbox != nil {
		rd.binds = append(rd.binds, mount{path: dir, writable: true})
		if argv, err = r.sandbox.wrap(rd, rd.binds, argv); err != nil {
			done()
			return nil, nil, err
		}
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c := rd.owner; c != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd, done, nil
}

// probeSandbox runs true in a sandbox as a job's user would (a leased id
// when infra is root), with the namespaces, /proc and system files every
// run has, so that a machine or container where bubblewrap cannot work
// (no user namespaces, a masked /proc, a seccomp filter) stops the service
// at start with bubblewrap's own words rather than failing every run. It
// binds nothing else: whether the job users reach PLAYBOOK_DIR and the run
// root is the service's own check, which logs what fails.
func (r *Runner) probeSandbox() error {
	rd, err := r.newRunDir("sandbox-probe", true)
	if err != nil {
		return fmt.Errorf("ansible runner: sandbox probe: %w", err)
	}
	defer rd.remove()
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	if rd.owner != nil {
		uid, gid = rd.owner.UID, rd.owner.GID
	}
	argv := append(r.sandbox.base(uid, gid), "--chdir", "/", "--", "/usr/bin/true")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = "/", []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if rd.owner != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ansible runner: bubblewrap cannot make a sandbox here (%v: %s); "+
			"in a container, run infra with --security-opt systempaths=unconfined (and seccomp=unconfined on Docker), "+
			"see docs/security.md, or set PLAYBOOK_SANDBOX=off for trusted projects only",
			err, strings.TrimSpace(string(out)))
	}
	return nil
}
