package ansible

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
)

const (
	// runDirPrefix starts the name of every run directory this package
	// creates under RunRoot.
	runDirPrefix = "ar-"
	// markerName is the marker file in a run directory; the owning process
	// holds an exclusive flock on it for the whole run, so a sweep can tell
	// a live run from a crashed one (flocks die with their process).
	markerName = ".autoprov-run"
	// safePath is the PATH of the child.
	safePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// runDir is the private directory of one run.
type runDir struct {
	path       string
	controlDir string    // ANSIBLE_SSH_CONTROL_PATH_DIR (unless warm)
	warm       *warmConn // the scope's warm connection (warm.go); nil: none
	tmpDir     string    // ANSIBLE_LOCAL_TEMP, TMPDIR
	agentSock  string    // SSH_AUTH_SOCK
	gate       string    // AUTOPROV_GATE_PATH (gate.go); "" when none
	inventory  string
	vars       string
	knownHosts string
	marker     *os.File    // flocked while the run lives
	owner      *Credential // the user the play runs as (runIdentity); nil: this process's
	lease      *uidLease   // a job's own user id (sandbox.go); nil: none
	binds      []mount     // what the sandbox shows besides the run dir
}

// own hands path to the user plays run as (nothing without Config.RunAs).
func (d *runDir) own(path string) error {
	if d.owner == nil {
		return nil
	}
	if err := os.Lchown(path, int(d.owner.UID), int(d.owner.GID)); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	return nil
}

// newRunDir creates a fresh run directory (0700) with its marker file,
// owned by the user the run runs as (a job's own with a sandbox).
func (r *Runner) newRunDir(jobID string, job bool) (*runDir, error) {
	owner, lease, err := r.runIdentity(job)
	if err != nil {
		return nil, err
	}
	path, err := os.MkdirTemp(r.cfg.RunRoot, runDirPrefix)
	if err != nil {
		lease.release()
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	d := &runDir{
		path:       path,
		controlDir: filepath.Join(path, "cp"),
		tmpDir:     filepath.Join(path, "tmp"),
		agentSock:  filepath.Join(path, "agent.sock"),
		inventory:  filepath.Join(path, "inventory.yml"),
		vars:       filepath.Join(path, "vars.yml"),
		knownHosts: filepath.Join(path, "known_hosts"),
		owner:      owner,
		lease:      lease,
	}
	if r.sandbox != nil {
		d.binds = slices.Clone(r.sandbox.shared)
		if !job {
			d.binds = append(d.binds, r.sandbox.fleet...)
		}
	}
	fail := func(err error) (*runDir, error) {
		d.remove()
		return nil, err
	}
	if err := os.Chmod(path, 0o700); err != nil {
		return fail(fmt.Errorf("run dir: %w", err))
	}
	m, err := createMarker(path, fmt.Sprintf("autoprovisioner ansible run\npid %d\njob %s\n", os.Getpid(), strconv.Quote(jobID)))
	d.marker = m
	if err != nil {
		return fail(fmt.Errorf("run dir: %w", err))
	}
	for _, sub := range []string{d.controlDir, d.tmpDir} {
		if err := os.Mkdir(sub, 0o700); err != nil {
			return fail(fmt.Errorf("run dir: %w", err))
		}
	}
	for _, p := range []string{path, d.controlDir, d.tmpDir} {
		if err := d.own(p); err != nil {
			return fail(err)
		}
	}
	return d, nil
}

// createMarker creates dir's marker file, locks it (for as long as the
// file stays open) and writes text to it. The file is returned with the
// error when it was created, for the caller to close.
func createMarker(dir, text string) (*os.File, error) {
	m, err := os.OpenFile(filepath.Join(dir, markerName), os.O_CREATE|os.O_EXCL|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("marker: %w", err)
	}
	if err := unix.Flock(int(m.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return m, fmt.Errorf("lock marker: %w", err)
	}
	if _, err := m.WriteString(text); err != nil {
		return m, fmt.Errorf("write marker: %w", err)
	}
	return m, nil
}

// handOver gives dir and everything in it to the user the run runs as
// (nothing when it runs as this process).
func (d *runDir) handOver(dir string) error {
	if d.owner == nil {
		return nil
	}
	if err := chownTree(dir, d.owner); err != nil {
		return fmt.Errorf("hand the job directory to the play's user: %w", err)
	}
	return nil
}

// chownTree gives dir and everything in it to c (symlinks themselves).
func chownTree(dir string, c *Credential) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(c.UID), int(c.GID))
	})
}

// within tells whether path is dir or lies under it (lexically).
func within(dir, path string) bool {
	if dir == "" {
		return false
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// writeFile creates name (which must not exist) with mode 0600, owned by
// the user plays run as.
func (d *runDir) writeFile(path string, data []byte) error {
	if err := writeFile(path, data); err != nil {
		return err
	}
	return d.own(path)
}

// writeFile creates name (which must not exist) with mode 0600.
func writeFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeInputs writes inventory.yml, known_hosts and vars.yml for spec.
func (d *runDir) writeInputs(spec *Spec, key pinnedKey, m remoteMarker) error {
	h := spec.Host
	// -F /dev/null: no ssh_config of this machine or user (a stray
	// "Host *" there could add a ProxyCommand or weaken checks).
	sshArgs := strings.Join([]string{
		"-F /dev/null",
		"-o UserKnownHostsFile=" + d.knownHosts,
		"-o GlobalKnownHostsFile=/dev/null",
		"-o StrictHostKeyChecking=yes",
		"-o HostKeyAlgorithms=" + key.algorithms,
	}, " ")
	// The interpreter and remote tmp dir carry the run's marker (remote.go).
	inv := fmt.Sprintf("all:\n  hosts:\n    %s:\n      ansible_host: !unsafe %s\n      ansible_port: %d\n      ansible_user: !unsafe %s\n      ansible_ssh_common_args: !unsafe %s\n"+
		"      ansible_python_interpreter: !unsafe %s\n      ansible_remote_tmp: !unsafe %s\n",
		quoted(h.Alias), quoted(h.Address), h.Port, quoted(h.User), quoted(sshArgs), quoted(m.interpreter()), quoted(m.remoteTmp()))
	if err := d.writeFile(d.inventory, []byte(inv)); err != nil {
		return fmt.Errorf("write inventory: %w", err)
	}
	if err := d.writeFile(d.knownHosts, []byte(knownHostsLine(h, key))); err != nil {
		return fmt.Errorf("write known_hosts: %w", err)
	}
	vars, err := unsafeYAML(spec.Vars)
	if err != nil {
		return err
	}
	if err := d.writeFile(d.vars, []byte(vars)); err != nil {
		return fmt.Errorf("write vars: %w", err)
	}
	return nil
}

// remove deletes the run directory and releases its marker lock and its
// user id (nothing of the run is left that could hold either).
func (d *runDir) remove() error {
	err := os.RemoveAll(d.path)
	if d.marker != nil {
		_ = d.marker.Close()
	}
	d.lease.release()
	if err != nil {
		return fmt.Errorf("remove run dir %s: %w", d.path, err)
	}
	return nil
}

// SweepLeftovers removes the run directories that crashed runs left under
// RunRoot, and kills processes still referring to them (an ssh
// ControlPersist master outlives its run by up to its persist time). Only
// directories named with this package's prefix, owned by this user, holding
// a marker file that no live process has locked are touched; symlinks are
// never followed. Call it once at start; it is safe while other runs (of this
// or another process) are live.
func (r *Runner) SweepLeftovers() (removed int, err error) {
	entries, err := os.ReadDir(r.cfg.RunRoot)
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", r.cfg.RunRoot, err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), runDirPrefix) {
			continue
		}
		path := filepath.Join(r.cfg.RunRoot, e.Name())
		ok, err := sweepOne(path, r.ownUID)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed++
			r.log.Info().Str("run_dir", path).Msg("removed run directory left by a crashed run")
		}
	}
	return removed, errors.Join(errs...)
}

// sweepOne removes path if it is an abandoned run directory.
func sweepOne(path string, own func(uid uint32) bool) (bool, error) {
	st, err := os.Lstat(path)
	if err != nil || !st.IsDir() {
		return false, nil // gone meanwhile, a file or a symlink: not ours
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || !own(sys.Uid) {
		return false, nil
	}
	m, err := os.OpenFile(filepath.Join(path, markerName), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil // no marker: not a run directory of ours
	}
	defer m.Close()
	if st, err := m.Stat(); err != nil || !st.Mode().IsRegular() {
		return false, nil
	}
	if err := unix.Flock(int(m.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // a live run holds it
	}
	killReferring(path)
	if err := os.RemoveAll(path); err != nil {
		return false, fmt.Errorf("sweep %s: %w", path, err)
	}
	return true, nil
}

// killReferring SIGKILLs this user's processes whose command line mentions
// dir (ssh masters show their control socket path there) and waits (up to
// about two seconds) until they are gone: on their pidfds, so it returns the
// moment the last one exits.
func killReferring(dir string) {
	var k proc.Killer
	defer k.Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		pids := processesReferring(dir)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			k.Signal(p, syscall.SIGKILL)
		}
		// Look again once they are gone: one may have forked meanwhile.
		if !k.WaitAll(deadline) && time.Now().After(deadline) {
			return
		}
	}
}

// processesReferring lists live processes of this user, other than this
// one, whose command line contains dir + "/".
func processesReferring(dir string) []int {
	needle := []byte(dir + "/")
	var out []int
	self := os.Getpid()
	uid := os.Geteuid()
	proc.Each(func(pid int) {
		if pid == self {
			return
		}
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, needle) {
			return
		}
		st, err := proc.ReadStat(pid)
		if err != nil || !st.Live() {
			return
		}
		var fi syscall.Stat_t
		if syscall.Stat("/proc/"+strconv.Itoa(pid), &fi) != nil || int(fi.Uid) != uid {
			return
		}
		out = append(out, pid)
	})
	sort.Ints(out)
	return out
}
