// Package ansible runs one ansible-playbook process, the way the infra
// service runs every play (and the Ansible tests run theirs),
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
//     (pkg/ansible/cmd/runguard), which kills the whole group, ssh
//     ControlPersist masters included, when the run ends or when this
//     process dies (even by SIGKILL); cancellation, a wall-clock timeout and
//     an idle timeout (no output) send SIGTERM to the group, then SIGKILL
//     after a grace period;
//   - the autoprov_events callback plugin (docs/events.md) writes JSON lines
//     to a pipe on fd 3 of the child (AUTOPROV_EVENTS_PATH=/dev/fd/3); they
//     are redacted, handed to Spec.OnEvent in order, and decide the outcome,
//     with the exit code as a cross-check;
//   - stdout and stderr (one pipe, so their lines stay in order) are drained
//     continuously; a redacted, size-capped tail is kept for the result;
//   - the run's remote work carries a marker (AUTOPROV_RUN in the
//     environment of every module process on the target): before the play
//     starts, a takeover over SSH stops what earlier runs of the same target
//     left running there (their controller died), and a stopped play's own
//     task is stopped on the target too (see remote.go). The caller must
//     hold the target (one run per target at a time).
//
// The Spec.Redact function is applied to all text before it leaves the
// package (events, output tail, errors, logs).
package ansible

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Config configures a Runner. New validates it; the fields documented with a
// default may be left zero, the others are required (the infra service's
// configuration holds their defaults).
type Config struct {
	// AnsibleDir is the repository's ansible/ directory (ansible.cfg,
	// playbooks/, roles/, plugins/); it is the child's working directory.
	AnsibleDir string
	// PlaybookBin is the ansible-playbook executable (absolute path).
	PlaybookBin string
	// RunRoot is the parent of the per-run directories. It must be an
	// absolute path of at most 32 bytes
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
	// KillGrace is the time between SIGTERM and SIGKILL.
	KillGrace time.Duration
	// Timeout is the wall-clock limit of a run whose Spec sets none.
	Timeout time.Duration
	// IdleTimeout is the limit on the time without output of a run whose
	// Spec sets none.
	IdleTimeout time.Duration
	// FactCacheDir is ANSIBLE_CACHE_PLUGIN_CONNECTION, shared by runs.
	// Default: autoprov-facts next to RunRoot.
	FactCacheDir string
	// OutputTailLines and OutputTailBytes bound Result.OutputTail.
	// Defaults 60 lines and 16 KiB.
	OutputTailLines int
	OutputTailBytes int
	// RunAs, when set, runs ansible-playbook (and everything it starts)
	// as this user and group instead of the service's, so that plays
	// cannot read the service's files, memory or environment. The service
	// must run as root. The run directories and FactCacheDir then belong
	// to this user, RunRoot becomes 0711 (traversable, not listable), and
	// AnsibleDir must be readable by the user.
	RunAs *Credential
	// Clean, when set, remembers which targets were left clean (see
	// CleanScopes): a run whose scope's last run ended clean skips its
	// takeover. Nil: every run takes over.
	Clean CleanScopes
	// WarmIdle, when positive, turns warm connections on for Run (never
	// RunJob): runs of one server, login user, pinned host key and SSH key
	// share one SSH connection that this process keeps open until it has
	// gone unused this long (warm.go). Zero: every run connects afresh.
	WarmIdle time.Duration
	// Sandbox, when set, runs every ansible-playbook in a sandbox of its
	// own (sandbox.go).
	Sandbox *Sandbox
}

// Credential is a user and group id (see Config.RunAs).
type Credential struct {
	UID, GID uint32
}

// Defaults of Config.
const (
	DefaultOutputTailLines = 60
	DefaultOutputTailBytes = 16 << 10
	// maxRunRootLen keeps <RunRoot>/ar-NNNNNNNNNN/cp/<40 hex>.<16 chars>
	// (ssh's temporary control socket name) within 107 bytes, and so
	// <RunRoot>/ar-wNNNNNNNNNN/s/<40 hex>.<16 chars> (warm.go).
	maxRunRootLen = 32
)

var runRootRe = regexp.MustCompile(`^/[A-Za-z0-9/._-]*$`)

// Runner runs ansible-playbook processes; it is safe for concurrent use.
type Runner struct {
	cfg   Config
	guard string // "" = no guard
	log   zerolog.Logger
	hooks hooks

	warm     *warmPool // nil: warm connections off
	warmArgs string    // ANSIBLE_SSH_ARGS of warm runs
	sandbox  *sandbox  // nil: runs are not sandboxed
}

// hooks let tests observe internals.
type hooks struct {
	onSpawn    func(pgid int, runDir string)
	onTimings  func(timings)
	onTakeover func() // called before the takeover's SSH session
}

// New validates cfg, fills the defaults of the optional fields and creates
// RunRoot and FactCacheDir when missing.
func New(cfg Config, log zerolog.Logger) (*Runner, error) {
	var missing []string
	for name, unset := range map[string]bool{"AnsibleDir": cfg.AnsibleDir == "", "PlaybookBin": cfg.PlaybookBin == "",
		"RunRoot": cfg.RunRoot == "", "KillGrace": cfg.KillGrace <= 0, "Timeout": cfg.Timeout <= 0, "IdleTimeout": cfg.IdleTimeout <= 0} {
		if unset {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("ansible runner: %s must be set (durations positive)", strings.Join(missing, ", "))
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
	if err := checkExecutable(cfg.PlaybookBin); err != nil {
		return nil, fmt.Errorf("ansible runner: PlaybookBin: %w", err)
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
	if cfg.RunAs != nil {
		if err := prepareRunAs(cfg); err != nil {
			return nil, err
		}
	} else if err := ensurePrivateDir(cfg.FactCacheDir); err != nil {
		return nil, fmt.Errorf("ansible runner: FactCacheDir: %w", err)
	}
	if cfg.OutputTailLines < 0 || cfg.OutputTailBytes < 0 {
		return nil, errors.New("ansible runner: negative output tail bounds")
	}
	cfg.OutputTailLines = cmp.Or(cfg.OutputTailLines, DefaultOutputTailLines)
	cfg.OutputTailBytes = cmp.Or(cfg.OutputTailBytes, DefaultOutputTailBytes)
	if cfg.WarmIdle < 0 {
		return nil, errors.New("ansible runner: negative WarmIdle")
	}
	r := &Runner{cfg: cfg, log: log}
	if cfg.Sandbox != nil {
		if r.sandbox, err = newSandbox(cfg); err != nil {
			return nil, err
		}
		if r.sandbox.uids.Count > 0 {
			// Job users bind their run directories from here.
			if err := os.Chmod(cfg.RunRoot, 0o711); err != nil {
				return nil, fmt.Errorf("ansible runner: RunRoot: %w", err)
			}
		}
		if err := r.probeSandbox(); err != nil {
			return nil, err
		}
	}
	if cfg.WarmIdle > 0 {
		r.warm = &warmPool{r: r, idle: cfg.WarmIdle, conns: map[string]*warmConn{}}
		r.warmArgs = warmSSHArgs(filepath.Join(dir, "ansible.cfg"))
	}
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

// CloseWarm closes the warm connections (Config.WarmIdle) to the inventory
// host alias, for example after its SSH check failed or its server was
// rebuilt: the next run connects afresh.
func (r *Runner) CloseWarm(alias string) {
	if r.warm != nil {
		r.warm.closeAlias(alias, "closed for the host")
	}
}

// Close closes every warm connection and returns once their ssh processes
// are gone; runs after it connect afresh. Without warm connections it
// does nothing.
func (r *Runner) Close() {
	if r.warm != nil {
		r.warm.close()
	}
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

// prepareRunAs readies the directories for runs as cfg.RunAs: RunRoot
// traversable by it, FactCacheDir (and what it holds) its own.
func prepareRunAs(cfg Config) error {
	if os.Geteuid() != 0 {
		return errors.New("ansible runner: RunAs needs the service to run as root")
	}
	if cfg.RunAs.UID == 0 {
		return errors.New("ansible runner: RunAs is root: name an unprivileged user")
	}
	if err := os.Chmod(cfg.RunRoot, 0o711); err != nil {
		return fmt.Errorf("ansible runner: RunRoot: %w", err)
	}
	dir := cfg.FactCacheDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ansible runner: FactCacheDir: %w", err)
	}
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("ansible runner: FactCacheDir %s is not a directory (or is a symlink)", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("ansible runner: FactCacheDir: %w", err)
	}
	if err := chownTree(dir, cfg.RunAs); err != nil {
		return fmt.Errorf("ansible runner: FactCacheDir: %w", err)
	}
	// Python caches that runs as another user left among the plugins
	// (private directories) make Ansible refuse its plugin paths; plays
	// write none now (PYTHONDONTWRITEBYTECODE).
	return filepath.WalkDir(cfg.AnsibleDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || d.Name() != "__pycache__" {
			return nil
		}
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("ansible runner: remove the Python cache %s: %w", path, err)
		}
		return filepath.SkipDir
	})
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

// ErrInvalidSpec is wrapped by Run's error when the spec itself is refused
// (a host alias, user or address the inventory cannot hold, a secret too
// large for an environment variable, a playbook that is not there): running
// it again cannot help.
var ErrInvalidSpec = errors.New("invalid run spec")

// Run runs spec.Playbook against spec.Host and returns when the process
// group is gone and the run directory removed. It returns an error only when
// the run could not start (invalid spec, wrapping ErrInvalidSpec; run
// directory, agent, exec);
// everything after that is in the Result (ctx cancellation gives Outcome
// cancelled).
func (r *Runner) Run(ctx context.Context, spec Spec) (*Result, error) {
	called := monoNow()
	key, err := r.validateSpec(&spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
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
	var steps Steps
	lap := newLapper()
	rd, err := r.newRunDir(spec.JobID, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := rd.remove(); err != nil {
			log.Error().Err(err).Msg("remove run dir")
		}
	}()
	marker := newRemoteMarker(spec.Host, key)
	log = log.With().Str("remote_run", marker.String()).Logger()
	if err := rd.writeInputs(&spec, key, marker); err != nil {
		return nil, err
	}
	lap.to(&steps.RunDir)
	ag, err := startAgent(rd.agentSock, spec.SSHKeys)
	if err != nil {
		return nil, err
	}
	if err := rd.own(rd.agentSock); err != nil {
		ag.close()
		return nil, err
	}
	defer ag.close()
	if r.warm != nil {
		if rd.warm = r.warm.acquire(spec.Host, key, ag.publicKeys(), log); rd.warm != nil {
			defer r.warm.release(rd.warm)
			rd.binds = append(rd.binds, mount{path: rd.warm.sockDir, writable: true})
		}
	}
	lap.to(&steps.Agent)

	g, err := rd.newGate()
	if err != nil {
		return nil, err
	}
	defer g.close()
	lap.to(&steps.RunDir)

	e := &execution{r: r, spec: &spec, rd: rd, log: log, gate: g}
	e.t.runCalled = called
	defer e.cleanup() // kills the group if a panic cuts supervise short
	if err := e.start(); err != nil {
		return nil, err
	}
	// No process of an earlier run may still run on the target when the
	// play's first task starts (remote.go): the takeover runs while
	// ansible-playbook starts up, which waits at the gate (gate.go).
	tk := make(chan takeoverDone, 1)
	go func() {
		at := time.Now()
		if r.hooks.onTakeover != nil {
			r.hooks.onTakeover()
		}
		if r.leftClean(ctx, marker, log) {
			log.Debug().Msg("takeover skipped: the target's last run of the scope succeeded")
			r.warmUp(ctx, rd, spec.Redact, log) // what the takeover would have started
			tk <- takeoverDone{report: &RemoteReport{Skipped: true}, at: time.Now(), took: time.Since(at)}
			return
		}
		rep, stop := r.takeover(ctx, rd, &spec, key, marker, log)
		tk <- takeoverDone{report: rep, stop: stop, at: time.Now(), took: time.Since(at)}
	}()
	res, err := e.supervise(ctx, tk)
	if e.deliverPanic != nil {
		panic(e.deliverPanic) // after cleanup, from the deferred calls
	}
	if err != nil {
		return nil, err
	}
	td := e.takeover
	res.RemoteRun, res.Takeover = marker.run, td.report
	steps.Takeover = td.took
	steps.TakeoverWait = e.gateWait()
	steps.Start = e.startTook()
	steps.Play = e.playTook()
	res.Steps = steps
	switch res.Outcome {
	case OutcomeCancelled, OutcomeTimeout, OutcomeIdleTimeout:
		// The play was stopped: so is its task on the target.
		res.Cleanup = r.cleanupRemote(ctx, rd, &spec, key, marker, log)
	case OutcomeSucceeded:
		r.markClean(ctx, marker, log)
	case OutcomeUnreachable:
		if rd.warm != nil {
			r.warm.closeAlias(spec.Host.Alias, "unreachable")
		}
	}
	done = &e.t
	return res, nil
}

// takeoverDone is how the takeover went.
type takeoverDone struct {
	report *RemoteReport
	stop   *Result // the run must not go on (see takeover)
	at     time.Time
	took   time.Duration
}

// takeover stops what earlier runs left running on the target (see
// remote.go). It returns the Result of a run that must not start: the
// takeover failed or ctx ended.
func (r *Runner) takeover(ctx context.Context, rd *runDir, spec *Spec, key pinnedKey, m remoteMarker, log zerolog.Logger) (*RemoteReport, *Result) {
	rep, err := r.warmTakeover(ctx, rd, spec, key, m, log)
	now := time.Now()
	switch {
	case ctx.Err() != nil:
		return rep, &Result{Outcome: OutcomeCancelled, ExitCode: -1, Hosts: map[string]Recap{}, StartedAt: now, FinishedAt: now,
			Err: errors.New(spec.Redact(fmt.Sprintf("cancelled before start (during the takeover): %v", context.Cause(ctx))))}
	case errors.Is(err, errTakeoverConnect):
		// The play connects the same way and will report the target
		// unreachable with ssh's own words.
		log.Warn().Err(err).Msg("takeover could not reach the target; the play will find it unreachable")
		return nil, nil
	case err != nil:
		log.Error().Err(err).Msg("takeover failed: the play does not start")
		return rep, &Result{Outcome: OutcomeError, ExitCode: -1, Hosts: map[string]Recap{}, StartedAt: now, FinishedAt: now,
			Err: fmt.Errorf("takeover of the target from earlier runs: %w", err)}
	}
	ev := log.Debug()
	if rep.Stopped > 0 {
		ev = log.Warn()
	}
	ev.Int("stopped", rep.Stopped).Int("killed", rep.Killed).Strs("earlier_runs", rep.Runs).Int("dirs_removed", rep.Dirs).
		Bool("privileged", rep.Privileged).Dur("took", rep.Duration).
		Msgf("takeover stopped %d processes of earlier runs on the target", rep.Stopped)
	if !rep.Privileged {
		log.Warn().Msg("takeover ran without root on the target (no passwordless sudo): it saw only the login user's processes")
	}
	return rep, nil
}

// warmTakeover is the takeover's reap, through the scope's warm master when
// the run has one: started first when the scope has none (no task
// connects before the gate opens). A master the takeover cannot get
// through (the server dropped it) is replaced once; a master that cannot
// be started leaves the run cold: the takeover and the play connect
// directly.
func (r *Runner) warmTakeover(ctx context.Context, rd *runDir, spec *Spec, key pinnedKey, m remoteMarker, log zerolog.Logger) (*RemoteReport, error) {
	w := rd.warm
	for attempt := 0; w != nil && attempt < 2; attempt++ {
		at := time.Now()
		started, err := w.ensure(ctx, rd.agentSock)
		if err != nil {
			log.Warn().Err(errors.New(spec.Redact(err.Error()))).Msg("warm SSH connection not started: the run connects directly")
			break
		}
		if started {
			log.Debug().Dur("took", time.Since(at)).Str("warm_scope", w.scope[:16]).Msg("warm SSH connection started")
		}
		rep, err := r.reap(ctx, rd, spec, key, m, reapTakeover, true)
		if !errors.Is(err, errTakeoverConnect) || ctx.Err() != nil {
			return rep, err
		}
		// The master is gone or the server dropped its connection.
		log.Info().Err(err).Msg("the warm SSH connection did not get through: starting a new one")
		w.drop()
	}
	return r.reap(ctx, rd, spec, key, m, reapTakeover, false)
}

// warmUp starts the run's warm master when it has one and the scope's is
// not running (a run whose takeover is skipped); a master that cannot be
// started leaves the run cold.
func (r *Runner) warmUp(ctx context.Context, rd *runDir, redact func(string) string, log zerolog.Logger) {
	w := rd.warm
	if w == nil {
		return
	}
	at := time.Now()
	started, err := w.ensure(ctx, rd.agentSock)
	switch {
	case err != nil:
		log.Warn().Err(errors.New(redact(err.Error()))).Msg("warm SSH connection not started: the run connects directly")
	case started:
		log.Debug().Dur("took", time.Since(at)).Str("warm_scope", w.scope[:16]).Msg("warm SSH connection started")
	}
}

// cleanupRemote stops the run's own task on the target after its play was
// stopped; whatever happens, the next run's takeover tries again.
func (r *Runner) cleanupRemote(ctx context.Context, rd *runDir, spec *Spec, key pinnedKey, m remoteMarker, log zerolog.Logger) *RemoteReport {
	rep, err := r.reap(context.WithoutCancel(ctx), rd, spec, key, m, reapCleanup, false)
	if err != nil {
		log.Warn().Err(err).Msg("cleanup of the stopped run on the target failed; the next run's takeover stops what is left")
		return rep
	}
	log.Info().Int("stopped", rep.Stopped).Int("killed", rep.Killed).Dur("took", rep.Duration).
		Msgf("cleanup stopped %d processes of the stopped run on the target", rep.Stopped)
	return rep
}

// lapper times consecutive steps: each lap counts the time since the last
// one (or since newLapper) to a step.
type lapper struct{ mark time.Time }

func newLapper() *lapper { return &lapper{mark: time.Now()} }

// to adds the time since the last lap to d.
func (l *lapper) to(d *time.Duration) {
	now := time.Now()
	*d += now.Sub(l.mark)
	l.mark = now
}
