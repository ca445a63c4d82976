// Package ansible runs one ansible-playbook process for the infra service,
// safely:
//
//   - every run gets a private directory (0700, files 0600) under RunRoot with
//     an inventory for exactly one host, a known_hosts file pinning its host
//     key, and the non-secret extra vars with every string tagged !unsafe;
//     the directory is removed when the run ends, whatever the way, and
//     SweepLeftovers removes those of crashed runs;
//   - the argv holds only file paths; the environment is built from an
//     allow-list (never os.Environ()) plus the run's secret variables;
//   - SSH private keys are served by an in-process ssh-agent on a unix socket
//     in the run directory and never touch the disk;
//   - the process runs in its own process group under the runguard binary
//     (services/infra/cmd/runguard), which kills the whole group, ssh
//     ControlPersist masters included, when the run ends or when this
//     process dies (even by SIGKILL); cancellation, a wall-clock timeout and
//     an idle timeout (no output) send SIGTERM to the group, then SIGKILL
//     after a grace period;
//   - the autoprov_events callback plugin (docs/events.md) writes JSON lines
//     to a pipe on fd 3 of the child (AUTOPROV_EVENTS_PATH=/dev/fd/3); they
//     are redacted, handed to Spec.OnEvent in order, and decide the outcome,
//     with the exit code as a cross-check;
//   - stdout and stderr (one pipe, so their lines stay in order) are drained
//     continuously; a redacted, size-capped tail is kept for the result.
//
// The Spec.Redact function is applied to all text before it leaves the
// package (events, output tail, errors, logs).
package ansible

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Config configures a Runner; New fills the defaults and validates it.
type Config struct {
	// AnsibleDir is the repository's ansible/ directory (ansible.cfg,
	// playbooks/, roles/, plugins/); it is the child's working directory.
	AnsibleDir string
	// PlaybookBin is the ansible-playbook executable (absolute path).
	// Default /usr/bin/ansible-playbook.
	PlaybookBin string
	// RunRoot is the parent of the per-run directories. Default
	// /tmp/autoprov-runs. It must be an absolute path of at most 32 bytes
	// (unix socket paths in the run directory are limited to 108 bytes) of
	// [A-Za-z0-9/._-], and if it exists a directory of this user that no one
	// else can write to; it is created 0700 when missing.
	RunRoot string
	// GuardPath is the runguard binary. Default: "runguard" next to
	// os.Executable(). When it is missing, runs go without the guard (with a
	// warning): ansible-playbook then gets Pdeathsig=SIGKILL, so it dies
	// with this process (strictly: with the OS thread that started it, which
	// Go does not end), but its workers and ssh processes, and the ssh
	// ControlPersist masters that left its group, live on after a crash
	// until they end or SweepLeftovers kills them; files Ansible writes in
	// the run dir follow this process's umask instead of 077. Normal ends,
	// cancellation and timeouts clean up fully in both modes.
	GuardPath string
	// KillGrace is the time between SIGTERM and SIGKILL. Default 10s.
	KillGrace time.Duration
	// Timeout is the default wall-clock limit of a run. Default 1h.
	Timeout time.Duration
	// IdleTimeout is the default limit on a run's time without output.
	// Default 10m.
	IdleTimeout time.Duration
	// FactCacheDir is ANSIBLE_CACHE_PLUGIN_CONNECTION, shared by runs.
	// Default: autoprov-facts next to RunRoot (/tmp/autoprov-facts).
	FactCacheDir string
	// OutputTailLines and OutputTailBytes bound Result.OutputTail.
	// Defaults 60 lines and 16 KiB.
	OutputTailLines int
	OutputTailBytes int
}

// Defaults of Config.
const (
	DefaultPlaybookBin     = "/usr/bin/ansible-playbook"
	DefaultRunRoot         = "/tmp/autoprov-runs"
	DefaultKillGrace       = 10 * time.Second
	DefaultTimeout         = time.Hour
	DefaultIdleTimeout     = 10 * time.Minute
	DefaultOutputTailLines = 60
	DefaultOutputTailBytes = 16 << 10
	// maxRunRootLen keeps <RunRoot>/ar-NNNNNNNNNN/cp/<40 hex>.<16 chars>
	// (ssh's temporary control socket name) within 107 bytes.
	maxRunRootLen = 32
)

var runRootRe = regexp.MustCompile(`^/[A-Za-z0-9/._-]*$`)

// Runner runs ansible-playbook processes; it is safe for concurrent use.
type Runner struct {
	cfg   Config
	guard string // "" = no guard
	log   zerolog.Logger
	hooks hooks
}

// hooks let tests observe internals.
type hooks struct {
	onSpawn   func(pgid int, runDir string)
	onTimings func(timings)
}

// New validates cfg, fills its defaults and creates RunRoot and
// FactCacheDir when missing.
func New(cfg Config, log zerolog.Logger) (*Runner, error) {
	if cfg.AnsibleDir == "" {
		return nil, errors.New("ansible runner: AnsibleDir not set")
	}
	dir, err := filepath.Abs(cfg.AnsibleDir)
	if err != nil {
		return nil, fmt.Errorf("ansible runner: AnsibleDir: %w", err)
	}
	cfg.AnsibleDir = dir
	for _, p := range []string{"ansible.cfg", "playbooks"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return nil, fmt.Errorf("ansible runner: AnsibleDir %s: %w", dir, err)
		}
	}
	if cfg.PlaybookBin == "" {
		cfg.PlaybookBin = DefaultPlaybookBin
	}
	if err := checkExecutable(cfg.PlaybookBin); err != nil {
		return nil, fmt.Errorf("ansible runner: PlaybookBin: %w", err)
	}
	if cfg.RunRoot == "" {
		cfg.RunRoot = DefaultRunRoot
	}
	cfg.RunRoot = filepath.Clean(cfg.RunRoot)
	if !runRootRe.MatchString(cfg.RunRoot) || len(cfg.RunRoot) > maxRunRootLen {
		return nil, fmt.Errorf("ansible runner: RunRoot %q: want an absolute path of at most %d bytes of [A-Za-z0-9/._-]", cfg.RunRoot, maxRunRootLen)
	}
	if err := ensurePrivateDir(cfg.RunRoot); err != nil {
		return nil, fmt.Errorf("ansible runner: RunRoot: %w", err)
	}
	if cfg.FactCacheDir == "" {
		cfg.FactCacheDir = filepath.Join(filepath.Dir(cfg.RunRoot), "autoprov-facts")
	}
	if err := ensurePrivateDir(cfg.FactCacheDir); err != nil {
		return nil, fmt.Errorf("ansible runner: FactCacheDir: %w", err)
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.OutputTailLines <= 0 {
		cfg.OutputTailLines = DefaultOutputTailLines
	}
	if cfg.OutputTailBytes <= 0 {
		cfg.OutputTailBytes = DefaultOutputTailBytes
	}
	r := &Runner{cfg: cfg, log: log}
	guard := cfg.GuardPath
	if guard == "" {
		if exe, err := os.Executable(); err == nil {
			guard = filepath.Join(filepath.Dir(exe), "runguard")
		}
	}
	if err := checkExecutable(guard); err != nil {
		log.Warn().Str("guard", guard).Err(err).Msg("runguard not usable: ansible-playbook runs without it; it dies with this process (Pdeathsig), but ssh ControlPersist masters may outlive a crash until swept")
	} else {
		r.guard = guard
	}
	return r, nil
}

// Config returns the effective configuration (defaults filled).
func (r *Runner) Config() Config { return r.cfg }

// Guarded tells whether runs go through runguard.
func (r *Runner) Guarded() bool { return r.guard != "" }

func checkExecutable(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%q is not an absolute path", path)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// ensurePrivateDir creates dir (0700) when missing and checks that it is a
// real directory of this user that nobody else can write to.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory (or is a symlink)", dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not owned by this user", dir)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others", dir)
	}
	return nil
}

// fixedEnvNames are the variables the runner sets in the child.
var fixedEnvNames = map[string]struct{}{
	"PATH": {}, "HOME": {}, "LANG": {}, "LC_ALL": {}, "TMPDIR": {},
	"ANSIBLE_CONFIG": {}, "ANSIBLE_LOCAL_TEMP": {}, "ANSIBLE_SSH_CONTROL_PATH_DIR": {},
	"ANSIBLE_CACHE_PLUGIN_CONNECTION": {}, "ANSIBLE_NOCOLOR": {}, "PYTHONUNBUFFERED": {},
	"SSH_AUTH_SOCK": {}, "AUTOPROV_EVENTS_PATH": {},
}

// childEnv is the complete environment of the child: an allow-list, then
// the run's secrets.
func (r *Runner) childEnv(d *runDir, spec *Spec) []string {
	env := []string{
		"PATH=" + safePath,
		"HOME=" + d.path, // ~/.ansible and friends die with the run dir
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"TMPDIR=" + d.tmpDir,
		"ANSIBLE_CONFIG=" + filepath.Join(r.cfg.AnsibleDir, "ansible.cfg"),
		"ANSIBLE_LOCAL_TEMP=" + d.tmpDir,
		"ANSIBLE_SSH_CONTROL_PATH_DIR=" + d.controlDir,
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + r.cfg.FactCacheDir,
		"ANSIBLE_NOCOLOR=1",
		"PYTHONUNBUFFERED=1",
		"SSH_AUTH_SOCK=" + d.agentSock,
		"AUTOPROV_EVENTS_PATH=/dev/fd/3",
	}
	for name, value := range spec.SecretEnv {
		env = append(env, name+"="+value)
	}
	return env
}

// Outcome is how a run ended.
type Outcome string

// Outcomes of a run.
const (
	// OutcomeSucceeded: exit 0 and no failed or unreachable host.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeFailed: a task failed (not ignored, not rescued).
	OutcomeFailed Outcome = "failed"
	// OutcomeUnreachable: the host could not be reached (or dropped).
	OutcomeUnreachable Outcome = "unreachable"
	// OutcomeTimeout: the wall-clock limit was hit and the run was killed.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeIdleTimeout: no output for IdleTimeout; the run was killed.
	OutcomeIdleTimeout Outcome = "idle_timeout"
	// OutcomeCancelled: the context ended; the run was killed.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeError: ansible-playbook failed otherwise (syntax error,
	// crash, no usable result).
	OutcomeError Outcome = "error"
)

// Result is what a run produced.
type Result struct {
	// Outcome is how the run ended.
	Outcome Outcome
	// ExitCode is ansible-playbook's exit status (128+N when signal N
	// killed it; -1 when it never started).
	ExitCode int
	// Hosts is the play recap per host: from the stats event, or counted
	// from host events when the run died before it.
	Hosts map[string]Recap
	// FailedTask is the first failure that decided the outcome: the failed
	// task, the unreachable host, or for timeout/idle_timeout/cancelled the
	// task that was running. Nil on success.
	FailedTask *FailedTask
	// OutputTail is the end of stdout+stderr, redacted.
	OutputTail string
	// StartedAt is when ansible-playbook was started, FinishedAt when the
	// run was over (process group gone).
	StartedAt, FinishedAt time.Time
	// Err says why when Outcome is not succeeded; it never holds a secret.
	Err error
}

// timings are CLOCK_MONOTONIC nanoseconds of a run's milestones, for the
// overhead benchmark.
type timings struct {
	runCalled    int64 // Run entered
	spawning     int64 // exec.Cmd.Start called
	spawned      int64 // exec.Cmd.Start returned (guard or playbook started)
	guardMain    int64 // runguard's main began (guarded)
	childStarted int64 // runguard started ansible-playbook (guarded)
	childExited  int64 // ansible-playbook exited (guarded: runguard saw it)
	reaped       int64 // the direct child was reaped
	returned     int64 // Run returning (run dir removed)
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Run runs spec.Playbook against spec.Host and returns when the process
// group is gone and the run directory removed. It returns an error only when
// the run could not start (invalid spec, run directory, agent, exec);
// everything after that is in the Result (ctx cancellation gives Outcome
// cancelled).
func (r *Runner) Run(ctx context.Context, spec Spec) (*Result, error) {
	called := monoNow()
	key, err := r.validateSpec(&spec)
	if err != nil {
		return nil, err
	}
	log := r.log.With().Str("job_id", spec.JobID).Str("host", spec.Host.Alias).Str("playbook", spec.Playbook).Logger()
	if err := ctx.Err(); err != nil {
		now := time.Now()
		return &Result{Outcome: OutcomeCancelled, ExitCode: -1, Hosts: map[string]Recap{}, StartedAt: now, FinishedAt: now,
			Err: errors.New(spec.Redact(fmt.Sprintf("cancelled before start: %v", context.Cause(ctx))))}, nil
	}
	var done *timings // set on success; reported after the deferred cleanup
	defer func() {
		if done != nil && r.hooks.onTimings != nil {
			done.returned = monoNow()
			r.hooks.onTimings(*done)
		}
	}()
	rd, err := r.newRunDir(spec.JobID)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := rd.remove(); err != nil {
			log.Error().Err(err).Msg("remove run dir")
		}
	}()
	if err := rd.writeInputs(&spec, key); err != nil {
		return nil, err
	}
	ag, err := startAgent(rd.agentSock, spec.SSHKeys)
	if err != nil {
		return nil, err
	}
	defer ag.close()

	e := &execution{r: r, spec: &spec, rd: rd, log: log}
	e.t.runCalled = called
	defer e.cleanup() // kills the group if a panic cuts supervise short
	if err := e.start(); err != nil {
		return nil, err
	}
	res, err := e.supervise(ctx)
	if e.deliverPanic != nil {
		panic(e.deliverPanic) // after cleanup, from the deferred calls
	}
	if err != nil {
		return nil, err
	}
	done = &e.t
	return res, nil
}

// execution is one started process and what is learnt from it.
type execution struct {
	r    *Runner
	spec *Spec
	rd   *runDir
	log  zerolog.Logger
	t    timings

	cmd     *exec.Cmd
	pgid    int
	guarded bool
	ctrl    *os.File // our end of the control socket (guarded)
	outR    *os.File
	evR     *os.File
	started time.Time

	mu     sync.Mutex
	exited bool // the direct child exited: no more signals to its group
	exitCh chan struct{}
	state  *os.ProcessState

	lastActivity atomic.Int64 // UnixNano of the last output or event
	tail         *tail
	events       eventState // owned by the event reader until evDone
	lastTask     atomic.Pointer[FailedTask]
	evDone       chan struct{}
	outDone      chan struct{}
	ctrlDone     chan struct{}
	queue        *eventQueue
	deliverDone  chan struct{}
	deliverPanic any
	panicCh      chan struct{}

	startCh    chan int // ansible-playbook's pid (guarded)
	startErr   atomic.Pointer[string]
	stopReason Outcome
	stopErr    error
	killTimer  *time.Timer
	cleaned    bool
}

// start starts the process (under the guard when there is one).
func (e *execution) start() error {
	r, spec, rd := e.r, e.spec, e.rd
	e.tail = newTail(r.cfg.OutputTailLines, r.cfg.OutputTailBytes, spec.Redact)
	e.exitCh = make(chan struct{})
	e.evDone = make(chan struct{})
	e.outDone = make(chan struct{})
	e.ctrlDone = make(chan struct{})
	e.deliverDone = make(chan struct{})
	e.panicCh = make(chan struct{}, 1)
	e.startCh = make(chan int, 1)
	e.queue = newEventQueue()

	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("output pipe: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("event pipe: %w", err)
	}
	closeAll := func(files ...*os.File) {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	argv := []string{r.cfg.PlaybookBin, "-i", rd.inventory, "-e", "@" + rd.vars,
		filepath.Join(r.cfg.AnsibleDir, "playbooks", spec.Playbook)}
	var cmd *exec.Cmd
	var guardEnd *os.File
	if r.guard != "" {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			closeAll(outR, outW, evR, evW)
			return fmt.Errorf("control socket: %w", err)
		}
		e.ctrl = os.NewFile(uintptr(fds[0]), "runguard-control")
		guardEnd = os.NewFile(uintptr(fds[1]), "runguard-control")
		// umask 077: what Ansible writes in the run dir is private too.
		args := append([]string{"-control-fd=4", "-pass-fd=3", "-grace=" + r.cfg.KillGrace.String(), "-umask=077", "--"}, argv...)
		cmd = exec.Command(r.guard, args...)
		cmd.ExtraFiles = []*os.File{evW, guardEnd} // fd 3, fd 4
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		e.guarded = true
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.ExtraFiles = []*os.File{evW} // fd 3
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	cmd.Dir = r.cfg.AnsibleDir
	cmd.Env = r.childEnv(rd, spec)
	cmd.Stdout = outW
	cmd.Stderr = outW
	e.lastActivity.Store(time.Now().UnixNano())
	e.t.spawning = monoNow()
	err = cmd.Start()
	e.t.spawned = monoNow()
	e.started = time.Now()
	closeAll(outW, evW, guardEnd)
	if err != nil {
		closeAll(outR, evR, e.ctrl)
		e.ctrl = nil
		return fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	e.cmd, e.pgid, e.outR, e.evR = cmd, cmd.Process.Pid, outR, evR
	if r.hooks.onSpawn != nil {
		r.hooks.onSpawn(e.pgid, rd.path)
	}

	go e.wait()
	go e.readOutput()
	go e.readEvents()
	go e.deliver()
	if e.guarded {
		go e.readControl()
	} else {
		close(e.ctrlDone)
		e.startCh <- cmd.Process.Pid
	}
	return nil
}

// wait waits for the direct child to exit, SIGKILLs whatever is left in
// its process group while the unreaped child still holds the group id (so
// the id cannot have been reused), then reaps it.
func (e *execution) wait() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, e.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	e.mu.Lock()
	_ = syscall.Kill(-e.pgid, syscall.SIGKILL)
	e.exited = true
	if e.killTimer != nil {
		e.killTimer.Stop()
	}
	e.mu.Unlock()
	_ = e.cmd.Wait()
	e.t.reaped = monoNow()
	e.state = e.cmd.ProcessState
	close(e.exitCh)
}

// signalGroup sends sig to the process group unless the child has exited.
func (e *execution) signalGroup(sig syscall.Signal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.exited {
		_ = syscall.Kill(-e.pgid, sig)
	}
}

func (e *execution) touch() { e.lastActivity.Store(time.Now().UnixNano()) }

func (e *execution) readOutput() {
	defer close(e.outDone)
	out := e.spec.Output
	if out == nil {
		readLines(e.outR, maxOutputLine, e.touch, e.tail.add)
		return
	}
	redact := e.spec.Redact
	if redact == nil {
		redact = func(s string) string { return s }
	}
	readLines(e.outR, maxOutputLine, e.touch, func(line []byte, long bool) {
		e.tail.add(line, long)
		text := redact(string(line))
		if long {
			text += " …[cut]"
		}
		_, _ = io.WriteString(out, text+"\n") // best effort: the full log is informative
	})
}

func (e *execution) readEvents() {
	defer close(e.evDone)
	defer e.queue.close()
	readLines(e.evR, maxEventLine, e.touch, func(line []byte, long bool) {
		if long {
			e.events.malformed++
			return
		}
		if len(strings.TrimSpace(string(line))) == 0 {
			return
		}
		ev, err := decodeEvent(line, e.spec.Redact)
		if err != nil {
			e.events.malformed++
			return
		}
		e.events.add(ev)
		if ev.Type == EventTaskStart || ev.Type == EventHandlerStart {
			e.lastTask.Store(&FailedTask{Name: ev.Task, Play: ev.Play, Host: e.spec.Host.Alias})
		}
		e.queue.push(ev)
	})
}

// deliver calls OnEvent for every event, in order. A panic in OnEvent
// stops the run; Run re-raises it after cleaning up.
func (e *execution) deliver() {
	defer close(e.deliverDone)
	for {
		ev, ok := e.queue.pop()
		if !ok {
			return
		}
		if e.spec.OnEvent == nil || e.deliverPanic != nil {
			continue
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					e.deliverPanic = p
					e.panicCh <- struct{}{}
				}
			}()
			e.spec.OnEvent(ev)
		}()
	}
}

// readControl reads runguard's status lines until it exits.
func (e *execution) readControl() {
	defer close(e.ctrlDone)
	sc := bufio.NewScanner(e.ctrl)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		num := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			n, _ := strconv.ParseInt(f[i], 10, 64)
			return n
		}
		switch f[0] {
		case "start":
			e.t.guardMain, e.t.childStarted = num(2), num(3)
			e.startCh <- int(num(1))
		case "exit":
			e.t.childExited = num(1)
		case "error":
			msg := e.spec.Redact(strings.TrimPrefix(sc.Text(), "error "))
			e.startErr.Store(&msg)
		}
	}
}

// stop ends the run for reason: SIGTERM to the group now, SIGKILL after
// KillGrace. Only the first reason counts.
func (e *execution) stop(reason Outcome, err error) {
	if e.stopReason != "" {
		return
	}
	e.stopReason, e.stopErr = reason, err
	e.log.Warn().Str("reason", string(reason)).Msg("stopping ansible-playbook")
	e.signalGroup(syscall.SIGTERM)
	e.mu.Lock()
	if !e.exited {
		e.killTimer = time.AfterFunc(e.r.cfg.KillGrace, func() { e.signalGroup(syscall.SIGKILL) })
	}
	e.mu.Unlock()
}

// supervise enforces the limits until the process exits, then collects the
// result.
func (e *execution) supervise(ctx context.Context) (*Result, error) {
	spec := e.spec
	wall := time.NewTimer(spec.Timeout)
	defer wall.Stop()
	check := spec.IdleTimeout / 10
	check = min(max(check, 50*time.Millisecond), time.Second)
	idle := time.NewTicker(check)
	defer idle.Stop()
	done := ctx.Done()
	pid := 0
	for running := true; running; {
		select {
		case <-done:
			done = nil
			e.stop(OutcomeCancelled, fmt.Errorf("cancelled: %w", context.Cause(ctx)))
		case <-wall.C:
			e.stop(OutcomeTimeout, fmt.Errorf("run exceeded its time limit of %s", spec.Timeout))
		case <-idle.C:
			if quiet := time.Since(time.Unix(0, e.lastActivity.Load())); quiet > spec.IdleTimeout {
				idle.Stop()
				e.stop(OutcomeIdleTimeout, fmt.Errorf("no output for %s (limit %s)", quiet.Round(time.Second), spec.IdleTimeout))
			}
		case pid = <-e.startCh:
			e.log.Info().Int("pid", pid).Bool("guarded", e.guarded).Msg("ansible-playbook started")
			if spec.OnStart != nil {
				spec.OnStart(pid)
			}
		case <-e.panicCh:
			e.stop(OutcomeError, errors.New("OnEvent panicked"))
		case <-e.exitCh:
			running = false
		}
	}
	e.cleanup()

	if pid == 0 {
		// The start line may have been read just before the exit was seen.
		select {
		case pid = <-e.startCh:
			if spec.OnStart != nil {
				spec.OnStart(pid)
			}
		default:
		}
	}
	if pid == 0 {
		// runguard could not start ansible-playbook.
		why := "runguard exited before starting it"
		if msg := e.startErr.Load(); msg != nil {
			why = *msg
		}
		return nil, fmt.Errorf("start ansible-playbook: %s", why)
	}
	return e.result(), nil
}

// cleanup makes sure nothing of the run is left: it stops a still running
// group (panic path), waits until the direct child is reaped, kills ssh
// ControlPersist masters that left the group, and drains the pipes. It is
// idempotent.
func (e *execution) cleanup() {
	if e.cleaned || e.cmd == nil {
		return
	}
	e.cleaned = true
	select {
	case <-e.exitCh:
	default:
		// Only on a panic: no grace, the run is over.
		e.signalGroup(syscall.SIGKILL)
		<-e.exitCh
	}
	// Masters that left the group by setsid: runguard has killed them when
	// it exited normally (they then remove their sockets); otherwise find
	// them by the control path in their command line.
	if ents, err := os.ReadDir(e.rd.controlDir); err == nil && len(ents) > 0 {
		killReferring(e.rd.path)
	}
	if e.ctrl != nil {
		e.ctrl.Close() // runguard is gone; nothing reads this end any more
	}
	// The readers get EOF once every holder of the pipes is gone; if
	// something unexpected keeps one open, stop waiting after a while.
	timeout := time.NewTimer(5 * time.Second)
	defer timeout.Stop()
	for _, ch := range []chan struct{}{e.outDone, e.evDone, e.ctrlDone} {
		select {
		case <-ch:
		case <-timeout.C:
			e.log.Warn().Msg("output pipes still open after the process group exited; closing them")
			e.outR.Close()
			e.evR.Close()
			<-ch
		}
	}
	e.outR.Close()
	e.evR.Close()
	<-e.deliverDone
}

// result collects the finished run's Result.
func (e *execution) result() *Result {
	code := exitCode(e.state)
	ev := &e.events
	res := &Result{
		ExitCode:   code,
		Hosts:      ev.hosts(),
		OutputTail: e.tail.String(),
		StartedAt:  e.started,
		FinishedAt: time.Now(),
	}
	if res.Hosts == nil {
		res.Hosts = map[string]Recap{}
	}
	v := verdict{stop: e.stopReason, stopErr: e.stopErr, code: code, ev: ev,
		lastTask: e.lastTask.Load(), alias: e.spec.Host.Alias, summary: e.tail.summary()}
	res.Outcome, res.FailedTask, res.Err = v.classify()
	if res.Err != nil {
		res.Err = errors.New(e.spec.Redact(res.Err.Error()))
	}
	if res.FailedTask != nil {
		ft := *res.FailedTask
		ft.Message = e.spec.Redact(ft.Message)
		res.FailedTask = &ft
	}
	if ev.malformed > 0 {
		e.log.Warn().Int("lines", ev.malformed).Msg("skipped malformed event lines")
	}
	if v.mismatch != "" {
		e.log.Warn().Int("exit_code", code).Msg(v.mismatch)
	}
	ll := e.log.Info()
	if res.Err != nil {
		ll = e.log.Warn().Str("error", res.Err.Error())
	}
	ll.Str("outcome", string(res.Outcome)).Int("exit_code", code).Int("events", ev.count).
		Dur("duration", res.FinishedAt.Sub(res.StartedAt)).Msg("ansible-playbook finished")
	return res
}

// exitCode is the exit status, 128+N when signal N killed the process.
func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// verdict holds what decides a run's outcome.
type verdict struct {
	stop     Outcome // set when the runner stopped the run
	stopErr  error
	code     int // exit status
	ev       *eventState
	lastTask *FailedTask // the task running last
	alias    string
	summary  string // the output line that best explains a failure
	mismatch string // set by classify when events and exit code disagree
}

// classify applies the outcome rules: the runner's own stop reason first;
// then the events (unreachable before failed; the stats event when there is
// one, else the host events); the exit code (0 ok, 2 failed hosts, 4
// unreachable hosts or a parse error, others errors) decides only what the
// events leave open.
func (v *verdict) classify() (Outcome, *FailedTask, error) {
	ev := v.ev
	var anyFailed, anyUnreachable bool
	for _, h := range ev.hosts() {
		anyFailed = anyFailed || h.Failed > 0
		anyUnreachable = anyUnreachable || h.Unreachable > 0
	}
	describe := func(ft *FailedTask) string {
		if ft == nil {
			return ""
		}
		s := ""
		if ft.Name != "" {
			s = fmt.Sprintf(" in task %q", ft.Name)
		}
		if ft.Message != "" {
			s += ": " + ft.Message
		}
		return s
	}
	switch {
	case v.stop != "":
		var ft *FailedTask
		if v.lastTask != nil && v.stop != OutcomeError {
			t := *v.lastTask
			t.Message = v.stopErr.Error()
			ft = &t
		}
		return v.stop, ft, v.stopErr
	case anyUnreachable || ev.unreached != nil:
		if v.code != 4 && v.code != 3 {
			v.mismatch = "events show an unreachable host but the exit code is not 4"
		}
		return OutcomeUnreachable, ev.unreached, fmt.Errorf("host %s unreachable%s", v.alias, describe(ev.unreached))
	case anyFailed || (ev.stats == nil && ev.failed != nil):
		if v.code != 2 {
			v.mismatch = "events show a failed task but the exit code is not 2"
		}
		return OutcomeFailed, ev.failed, fmt.Errorf("failed on %s%s", v.alias, describe(ev.failed))
	case v.code == 0:
		if ev.stats == nil {
			v.mismatch = "ansible-playbook exited 0 without a stats event: is the autoprov_events callback enabled?"
		}
		return OutcomeSucceeded, nil, nil
	case v.code == 2 && ev.stats == nil:
		v.mismatch = "exit code 2 (failed hosts) without failure events"
		return OutcomeFailed, nil, fmt.Errorf("ansible-playbook reported failed hosts (exit 2): %s", v.summary)
	default:
		return OutcomeError, nil, fmt.Errorf("ansible-playbook exited with status %d: %s", v.code, v.summary)
	}
}

// eventQueue is an unbounded FIFO between the event reader and OnEvent, so
// that a slow consumer never blocks ansible-playbook's writes.
type eventQueue struct {
	mu     sync.Mutex
	items  []Event
	closed bool
	ready  chan struct{} // has a token when items or closed changed
}

func newEventQueue() *eventQueue { return &eventQueue{ready: make(chan struct{}, 1)} }

func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	q.items = append(q.items, ev)
	q.mu.Unlock()
	q.wake()
}

func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wake()
}

func (q *eventQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the next event; false when the queue is closed and empty.
func (q *eventQueue) pop() (Event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return ev, true
		}
		if q.closed {
			q.mu.Unlock()
			return Event{}, false
		}
		q.mu.Unlock()
		<-q.ready
	}
}
