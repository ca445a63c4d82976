package ansible

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Remote work and its controller.
//
// Killing ansible-playbook (a crash of this process, a cancelled or timed-out
// run) ends the SSH connections, but not the module processes they started
// on the target: without a terminal nothing sends them SIGHUP, and a task's
// command (a long "sleep", a package install) runs on. A run that took over
// would then start its play beside them. So every run marks its remote
// work, and stops what earlier runs left before its own play starts:
//
//   - The marker: every module of a run starts as
//     "/usr/bin/env AUTOPROV_RUN=<scope>.<run> python3" (the inventory's
//     ansible_python_interpreter), so the module process and everything it
//     starts carry AUTOPROV_RUN in their environment, also across sudo
//     (become) and setsid. <scope> is a hash of the target (alias, address,
//     port, pinned host key): the runs of one server share it, other
//     servers never do. <run> is random per run. The remote tmp dir is the
//     scope's, ~/.ansible/tmp/autoprov-<scope>: the runs of a server take
//     turns (the server lock), so one dir per server is left, never one per
//     run (runs that skip the takeover remove nothing).
//   - The takeover: before the play starts, one SSH session (the run's own
//     pinned host key and agent; root through "sudo -n" when the login user
//     is not root) runs reap.py, which finds the tasks of earlier runs of the
//     scope still running (a module process with another run's marker) with
//     their descendants, process groups and sessions, sends them SIGTERM,
//     SIGKILL after KillGrace, checks that none is left and removes the
//     remote tmp dir with what earlier runs left in it. Only then does the play start; a
//     takeover that leaves a process alive fails the run (OutcomeError)
//     without starting it. The caller must hold the server (the infra
//     service's server lock): any other run of the scope is by then one
//     whose controller is gone.
//   - The cleanup: a run that was stopped (cancelled, timeout, idle timeout)
//     runs reap.py for its own marker after its process group is gone, so
//     its task does not outlive it either.
//   - The clean mark (Config.Clean, optional): a run whose play succeeded
//     (ansible-playbook exited 0 by itself: every task of it returned)
//     marks its scope clean; the next run of the scope takes the mark away
//     and, when it was there, skips its takeover: nothing of the run before
//     it can be running. A run that dies after taking the mark leaves none,
//     so the run after it takes over. Failed runs mark nothing (a task's
//     own timeout may leave its module running), nor do stopped ones.
//
// Processes a finished task left on purpose (a daemon started with
// start-stop-daemon or setsid, a service) are not tasks and are never
// stopped. Tasks that run no Python module on the target (raw, script) carry
// no marker.

//go:embed reap.py
var reapScript []byte

// markerEnv is the environment variable carrying a run's marker on the target.
const markerEnv = "AUTOPROV_RUN"

// RemoteReport says what a takeover or a cleanup found on the target.
type RemoteReport struct {
	// Stopped is the number of processes of earlier runs (takeover) or of
	// the run itself (cleanup) that were signalled.
	Stopped int `json:"stopped"`
	// Killed is how many of them needed SIGKILL after KillGrace.
	Killed int `json:"killed"`
	// Left is the number still alive afterwards (0, or the step failed).
	Left int `json:"left"`
	// Runs are the markers' run parts of the runs whose tasks were stopped.
	Runs []string `json:"runs"`
	// Dirs is the number of remote tmp dirs removed (the scope's, and
	// per-run ones of earlier versions).
	Dirs int `json:"dirs"`
	// Privileged tells whether the step ran as root on the target; without
	// root it sees and stops only the login user's processes.
	Privileged bool `json:"privileged"`
	// Duration is how long the step took, SSH connection included.
	Duration time.Duration `json:"-"`
	// Skipped: the takeover did not run, the scope's last run having ended
	// clean (Config.Clean).
	Skipped bool `json:"skipped,omitempty"`
}

// CleanScopes remembers the scopes (targets, see remoteMarker) whose last
// run ended clean. The caller must hold the server, as for the takeover.
type CleanScopes interface {
	// TakeClean reports whether scope is marked clean, and removes the
	// mark in the same step.
	TakeClean(ctx context.Context, scope string) (bool, error)
	// MarkClean marks scope clean.
	MarkClean(ctx context.Context, scope string) error
}

// cleanMarkTimeout bounds each use of Config.Clean.
const cleanMarkTimeout = 5 * time.Second

// leftClean takes the scope's clean mark (Config.Clean): true when the
// takeover may be skipped. Any error means a takeover.
func (r *Runner) leftClean(ctx context.Context, m remoteMarker, log zerolog.Logger) bool {
	if r.cfg.Clean == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, cleanMarkTimeout)
	defer cancel()
	clean, err := r.cfg.Clean.TakeClean(ctx, m.scope)
	if err != nil {
		log.Warn().Err(err).Msg("reading the target's clean mark failed: the takeover runs")
		return false
	}
	return clean
}

// markClean marks the run's scope clean after its play succeeded; a
// failure only costs the next run a takeover.
func (r *Runner) markClean(ctx context.Context, m remoteMarker, log zerolog.Logger) {
	if r.cfg.Clean == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanMarkTimeout)
	defer cancel()
	if err := r.cfg.Clean.MarkClean(ctx, m.scope); err != nil {
		log.Warn().Err(err).Msg("marking the target clean failed: its next run takes over")
	}
}

// remoteMarker is the marker of one run: "<scope>.<run>", [0-9a-f.] only
// (it is part of a shell command on the target).
type remoteMarker struct{ scope, run string }

func (m remoteMarker) String() string { return m.scope + "." + m.run }

// newRemoteMarker returns a fresh marker for a run against h (validated).
func newRemoteMarker(h Host, key pinnedKey) remoteMarker {
	sum := sha256.Sum256([]byte(h.Alias + "\x00" + h.Address + "\x00" + strconv.Itoa(h.Port) + "\x00" + key.line))
	var b [8]byte
	_, _ = rand.Read(b[:])
	return remoteMarker{scope: hex.EncodeToString(sum[:8]), run: hex.EncodeToString(b[:])}
}

// interpreter is the run's ansible_python_interpreter: python3 with the
// marker in its environment.
func (m remoteMarker) interpreter() string {
	return "/usr/bin/env " + markerEnv + "=" + m.String() + " python3"
}

// remoteTmp is the run's remote tmp dir (ansible_remote_tmp): its scope's.
func (m remoteMarker) remoteTmp() string { return "~/.ansible/tmp/autoprov-" + m.scope }

// reapMode is what reap.py stops.
type reapMode string

const (
	reapTakeover reapMode = "takeover" // earlier runs of the scope
	reapCleanup  reapMode = "cleanup"  // the run itself
)

// errTakeoverConnect: the takeover's SSH session did not get through; the
// play will find the target unreachable the same way.
var errTakeoverConnect = errors.New("ssh connection failed")

// reapCommand is the remote command: root through sudo -n when the login
// user is not root and may; the script comes on stdin.
func reapCommand(mode reapMode, m remoteMarker, grace time.Duration) string {
	args := fmt.Sprintf("- %s %s %.3f", mode, m, grace.Seconds())
	return `if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then exec sudo -n python3 ` + args +
		`; else exec python3 ` + args + `; fi`
}

// sshArgs are the options of ssh for the run's own target: no ssh_config,
// the run's pinned host key only, keys from the run's agent only; through
// the scope's warm master when the run has one (warm.go; ssh connects
// directly when its socket is not there), else without multiplexing.
func sshArgs(d *runDir, h Host, key pinnedKey) []string {
	if d.warm != nil {
		return sshOptions(d.knownHosts, h, key, "no", d.warm.controlPath())
	}
	return sshOptions(d.knownHosts, h, key, "no", "none")
}

// sshOptions are sshArgs with the given known_hosts file, ControlMaster
// and ControlPath.
func sshOptions(knownHosts string, h Host, key pinnedKey, controlMaster, controlPath string) []string {
	return []string{
		"-F", "/dev/null",
		"-o", "UserKnownHostsFile=" + knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "HostKeyAlgorithms=" + key.algorithms,
		"-o", "BatchMode=yes",
		"-o", "PreferredAuthentications=publickey",
		"-o", "PasswordAuthentication=no",
		"-o", "ControlMaster=" + controlMaster,
		"-o", "ControlPath=" + controlPath,
		"-o", "ConnectTimeout=10",
		"-o", "ServerAliveInterval=15",
		"-o", "ServerAliveCountMax=4",
		"-p", strconv.Itoa(h.Port),
		"-l", h.User,
	}
}

// reap runs reap.py on the run's target. The SSH key comes from the run's
// agent; nothing secret is on the command line.
// With viaMaster, ssh goes through the run's warm master only: without
// one it fails as a connection failure (ProxyCommand /bin/false) instead
// of connecting directly.
func (r *Runner) reap(ctx context.Context, d *runDir, spec *Spec, key pinnedKey, m remoteMarker, mode reapMode, viaMaster bool) (*RemoteReport, error) {
	start := time.Now()
	grace := r.cfg.KillGrace
	// Bound: connect, TERM, grace, KILL and its wait, with room to spare.
	ctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
	defer cancel()
	args := sshArgs(d, spec.Host, key)
	if viaMaster {
		args = append(args, "-o", "ProxyCommand=/bin/false")
	}
	args = append(args, "--", spec.Host.Address, reapCommand(mode, m, grace))
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Env = []string{"PATH=" + safePath, "HOME=" + d.path, "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "SSH_AUTH_SOCK=" + d.agentSock}
	cmd.Dir = d.tmpDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// As the fleet's play user (the warm master admits only its own user),
	// never as a job's own: that id has no account outside its sandbox,
	// and the takeover is this service's code, not the job's.
	if c := r.cfg.RunAs; c != nil && d.lease == nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = bytes.NewReader(reapScript)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	rep, perr := parseReapOutput(stdout.Bytes())
	if rep != nil {
		rep.Duration = time.Since(start)
	}
	switch {
	case err != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 255 && rep == nil:
		return nil, fmt.Errorf("%s on %s: %w: %s", mode, spec.Host.Alias, errTakeoverConnect, spec.Redact(lastLine(stderr.String())))
	case err != nil:
		return rep, fmt.Errorf("%s on %s: %w: %s", mode, spec.Host.Alias, err, spec.Redact(lastLine(stderr.String())))
	case perr != nil:
		return nil, fmt.Errorf("%s on %s: %w: %s", mode, spec.Host.Alias, perr, spec.Redact(lastLine(stderr.String())))
	case rep.Left > 0:
		return rep, fmt.Errorf("%s on %s: %d processes of earlier runs still alive after SIGKILL", mode, spec.Host.Alias, rep.Left)
	}
	return rep, nil
}

// parseReapOutput reads reap.py's report: the last line that is a JSON
// object (a login banner or a shell's chatter may come before it).
func parseReapOutput(out []byte) (*RemoteReport, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var raw struct {
			RemoteReport
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(l), &raw); err != nil {
			return nil, fmt.Errorf("unreadable report %q: %w", l, err)
		}
		if raw.Error != "" {
			return nil, fmt.Errorf("reap: %s", raw.Error)
		}
		rep := raw.RemoteReport
		return &rep, nil
	}
	return nil, errors.New("no report (is python3 installed on the target?)")
}

// lastLine is the last non-empty line of s, cut at 512 bytes.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if len(l) > 512 {
		l = l[:512]
	}
	return l
}

// RemoteScope returns the scope part of the markers of h's runs: every
// process of a run against h on the target has AUTOPROV_RUN=<scope>.<run>
// in its environment (an operator finds them with
// grep -l AUTOPROV_RUN=<scope>. /proc/*/environ).
func RemoteScope(h Host) (string, error) {
	key, err := validateHost(&h)
	if err != nil {
		return "", err
	}
	return newRemoteMarker(h, key).scope, nil
}
