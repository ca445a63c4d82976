package ansible

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// jobHostAlias is the alias of a job's run, which has no one host: the
// messages of its outcome name the host of the failure instead.
const jobHostAlias = "of the job"

// A job (RunJob) is a general Ansible run: a playbook of the caller's
// checkout on several hosts, with the options of ansible-playbook a CI
// pipeline uses. It keeps every safety of Run (private run directory,
// allow-listed environment, in-process ssh-agent, pinned host keys, extra
// vars as !unsafe data, runguard, redaction, time limits), and adds:
//
//   - an inventory of many hosts, each pinned to its own host key; a host
//     that failed its SSH check stays in the inventory (so plays, limits and
//     the recap see it) but its ssh fails at once without a packet sent
//     (ProxyCommand /bin/false), so Ansible reports it unreachable and goes
//     on with the others;
//   - the vault password through a --vault-password-file script that prints
//     it from the environment: it is never written to disk or argv;
//   - the become password through the environment (a lookup in the
//     generated inventory), never on disk;
//   - secret extra variables (SecretVars) through the environment: a
//     generated vars file holds only each one's env lookup, never a value;
//   - a fact cache of its own (memory): a job's host names are the
//     caller's, and must never read the facts another run cached.
//
// There is no takeover or remote cleanup (remote.go) for jobs: they hold
// their hosts' locks, but their remote processes carry no marker.

// Environment variables of a job's secrets (in the child's environment
// only).
const (
	envVaultPassword  = "AUTOPROV_VAULT_PASSWORD"
	envBecomePassword = "AUTOPROV_BECOME_PASSWORD"
	// envSecretVar prefixes the variable of SecretVars' n-th name (in
	// sorted order): AUTOPROV_SECRET_VAR_0, ...
	envSecretVar = "AUTOPROV_SECRET_VAR_"
)

// secretVarsFile is the run directory's file of SecretVars' lookups.
const secretVarsFile = "secret-vars.yml"

// JobHost is one host of a job.
type JobHost struct {
	// Host is where and as whom to connect. Alias is the inventory name the
	// caller chose: [A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}. KnownHostsKey may
	// be empty only when Blocked.
	Host
	// Vars are the host's own inventory variables (data: every string is
	// tagged !unsafe). Connection variables are the runner's: only
	// ansible_python_interpreter, ansible_become, ansible_become_user and
	// ansible_become_method may be set among the ansible_* names.
	Vars map[string]any
	// Blocked: the host did not pass its SSH check. Ansible sees it
	// unreachable, without a connection attempt.
	Blocked bool
	// ScopeAlias names the host in its remote marker's scope (remote.go)
	// instead of Alias: the name deploys and provisioning runs give the
	// same server, so that a job's takeover stops what their runs left
	// and theirs what the job's left. Empty: Alias.
	ScopeAlias string
}

// JobGroup is a group of a job's generated inventory.
type JobGroup struct {
	Hosts    []string
	Children []string
	Vars     map[string]any
}

// JobOptions are the ansible-playbook options a job may set.
type JobOptions struct {
	Tags, SkipTags []string
	Limit          string
	Check, Diff    bool
	Verbosity      int // 0-4
	Forks          int // 0: ansible.cfg's
}

// JobSpec describes one ansible-playbook run of a job. Of the embedded
// Spec, Playbook and Host are unused; Vars are the job's extra vars.
type JobSpec struct {
	Spec
	// Dir is the job's own directory (its checkout, installed requirements
	// and resolved inventory), handed to the user the run runs as and, in
	// a sandbox, shown read-only; PlaybookPath, InventoryFile and Env's
	// paths lie under it then. "": none.
	Dir string
	// PlaybookPath is the absolute path of the playbook (a regular file in
	// the job's checkout).
	PlaybookPath string
	// Hosts are every host of the inventory, with their connection.
	Hosts []JobHost
	// Groups of the generated inventory (inline inventories).
	Groups map[string]JobGroup
	// InventoryFile is a resolved inventory (git, url) read before the
	// generated one, whose connection settings win; "": none.
	InventoryFile string
	// InventoryEnabled is the inventory plugin that reads InventoryFile
	// (e.g. ansible.builtin.ini); the generated inventory is YAML, and no
	// other plugin is enabled (no script, no plugin configuration).
	InventoryEnabled string
	// Options of ansible-playbook.
	Options JobOptions
	// VaultPassword and BecomePassword are secrets ("": none); they reach
	// Ansible through the environment only.
	VaultPassword, BecomePassword string
	// SecretVars are extra variables whose values are secrets (name to
	// value). Each reaches the play through the environment only
	// (AUTOPROV_SECRET_VAR_<n>): the run directory's secret-vars.yml,
	// passed with -e after Vars, holds only "{{ lookup('ansible.builtin.env',
	// ...) }}" for each name, and a lookup's result is unsafe, so a value
	// is never templated. Names follow Vars' rules (no ansible_*) and may
	// not be in Vars too. The caller redacts the values (Spec.Redact).
	SecretVars map[string]string
	// Env adds ANSIBLE_COLLECTIONS_PATH or ANSIBLE_ROLES_PATH (where the
	// job's requirements were installed); other names are refused.
	Env map[string]string
}

var (
	jobAliasRe   = pattern.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]*$`, 253)
	groupNameRe  = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`, 128)
	jobTagRe     = pattern.MustCompile(`^[A-Za-z0-9_.:-]+$`, 128)
	pluginNameRe = regexp.MustCompile(`^[a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+$`)
	jobLimitRe   = regexp.MustCompile(`^[A-Za-z0-9_.:,!&*\[\]~-]+$`)
)

// jobEnvNames are the names JobSpec.Env may set.
var jobEnvNames = []string{"ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_ROLES_PATH"}

// jobHostVars are the ansible_* variables a JobHost's or JobGroup's Vars
// may set.
var jobHostVars = []string{"ansible_python_interpreter", "ansible_become", "ansible_become_user", "ansible_become_method"}

// placeholderKey stands in for the missing pinned key of a blocked host
// while its other fields are checked.
const placeholderKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"

// validateJob checks js and fills the defaults of its Spec.
func (r *Runner) validateJob(js *JobSpec) ([]pinnedKey, error) {
	if js.JobID == "" {
		return nil, errors.New("job spec: empty job id")
	}
	if !filepath.IsAbs(js.PlaybookPath) {
		return nil, fmt.Errorf("job spec: playbook %q is not an absolute path", js.PlaybookPath)
	}
	if st, err := os.Lstat(js.PlaybookPath); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("job spec: playbook %s is not a regular file", filepath.Base(js.PlaybookPath))
	}
	if js.InventoryFile != "" {
		if st, err := os.Lstat(js.InventoryFile); err != nil || !filepath.IsAbs(js.InventoryFile) || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("job spec: inventory file %s is not a regular file", filepath.Base(js.InventoryFile))
		}
	}
	if js.Dir != "" {
		if st, err := os.Lstat(js.Dir); err != nil || !filepath.IsAbs(js.Dir) || !st.IsDir() {
			return nil, fmt.Errorf("job spec: directory %q is not an absolute path of a directory", js.Dir)
		}
	}
	if r.sandbox != nil {
		// The sandbox shows the job's directory only.
		paths := []string{js.PlaybookPath, js.InventoryFile}
		for _, name := range jobEnvNames {
			paths = append(paths, filepath.SplitList(js.Env[name])...)
		}
		for _, p := range paths {
			if p != "" && !within(js.Dir, p) {
				return nil, fmt.Errorf("job spec: %s is outside the job's directory, which is all a sandboxed job sees", p)
			}
		}
	}
	if js.InventoryEnabled != "" && !pluginNameRe.MatchString(js.InventoryEnabled) {
		return nil, fmt.Errorf("job spec: inventory plugin %q", js.InventoryEnabled)
	}
	if len(js.Hosts) == 0 {
		return nil, errors.New("job spec: no host")
	}
	keys := make([]pinnedKey, len(js.Hosts))
	seen := map[string]bool{}
	for i := range js.Hosts {
		h := &js.Hosts[i]
		if !jobAliasRe.MatchString(h.Alias) {
			return nil, fmt.Errorf("job spec: host name %q: want %s", h.Alias, jobAliasRe)
		}
		if seen[h.Alias] {
			return nil, fmt.Errorf("job spec: host %s listed twice", h.Alias)
		}
		seen[h.Alias] = true
		c := h.Host
		c.Alias = "h"
		if h.Blocked && c.KnownHostsKey == "" {
			c.KnownHostsKey = placeholderKey
		}
		key, err := validateHost(&c)
		if err != nil {
			return nil, fmt.Errorf("job spec: host %s: %w", h.Alias, err)
		}
		h.Port = c.Port
		if !h.Blocked {
			keys[i] = key
		}
		if err := checkJobVars(h.Vars); err != nil {
			return nil, fmt.Errorf("job spec: host %s: %w", h.Alias, err)
		}
	}
	for name, g := range js.Groups {
		if !groupNameRe.MatchString(name) || name == "all" || name == "ungrouped" {
			return nil, fmt.Errorf("job spec: group name %q", name)
		}
		for _, h := range g.Hosts {
			if !seen[h] {
				return nil, fmt.Errorf("job spec: group %s: unknown host %q", name, h)
			}
		}
		for _, c := range g.Children {
			if _, ok := js.Groups[c]; !ok || c == name {
				return nil, fmt.Errorf("job spec: group %s: unknown child group %q", name, c)
			}
		}
		if err := checkJobVars(g.Vars); err != nil {
			return nil, fmt.Errorf("job spec: group %s: %w", name, err)
		}
	}
	o := js.Options
	for _, t := range slices.Concat(o.Tags, o.SkipTags) {
		if !jobTagRe.MatchString(t) {
			return nil, fmt.Errorf("job spec: tag %q: want %s", t, jobTagRe)
		}
	}
	if o.Limit != "" && (len(o.Limit) > 4096 || !jobLimitRe.MatchString(o.Limit) || strings.HasPrefix(o.Limit, "@")) {
		return nil, fmt.Errorf("job spec: limit %q: want a host pattern", o.Limit)
	}
	if o.Verbosity < 0 || o.Verbosity > 4 || o.Forks < 0 || o.Forks > 1000 {
		return nil, errors.New("job spec: verbosity or forks out of range")
	}
	for name, v := range js.Env {
		if !slices.Contains(jobEnvNames, name) {
			return nil, fmt.Errorf("job spec: env %s: only %s may be set", name, strings.Join(jobEnvNames, ", "))
		}
		if strings.ContainsAny(v, "\x00\n") {
			return nil, fmt.Errorf("job spec: env %s: NUL or newline", name)
		}
	}
	for k := range js.SecretVars {
		if _, ok := js.Vars[k]; ok {
			return nil, fmt.Errorf("job spec: secret var %s is an extra var too", k)
		}
	}
	if err := checkJobVars(asAny(js.SecretVars)); err != nil {
		return nil, fmt.Errorf("job spec: secret vars: %w", err)
	}
	// The shared checks of Spec (secret env, time limits) on a copy that
	// names a playbook and a host they accept.
	spec := js.Spec
	if js.VaultPassword != "" || js.BecomePassword != "" || len(js.SecretVars) > 0 {
		spec.SecretEnv = make(map[string]string, len(js.SecretEnv)+2+len(js.SecretVars))
		for k, v := range js.SecretEnv {
			if strings.HasPrefix(k, envSecretVar) && len(js.SecretVars) > 0 {
				return nil, fmt.Errorf("job spec: secret env %s: the runner's own name for a secret var", k)
			}
			spec.SecretEnv[k] = v
		}
		if js.VaultPassword != "" {
			spec.SecretEnv[envVaultPassword] = js.VaultPassword
		}
		if js.BecomePassword != "" {
			spec.SecretEnv[envBecomePassword] = js.BecomePassword
		}
		for i, k := range sortedKeys(js.SecretVars) {
			spec.SecretEnv[envSecretVar+strconv.Itoa(i)] = js.SecretVars[k]
		}
	}
	if err := r.validateShared(&spec); err != nil {
		return nil, err
	}
	js.Spec = spec
	return keys, nil
}

// validateShared checks a Spec's secret environment and fills its time
// limits and Redact: the part of validateSpec that jobs share.
func (r *Runner) validateShared(spec *Spec) error {
	for name, value := range spec.SecretEnv {
		if err := validateEnvName(name); err != nil {
			return fmt.Errorf("spec: secret env: %w", err)
		}
		if strings.IndexByte(value, 0) >= 0 {
			return fmt.Errorf("spec: secret env %s: value holds a NUL byte", name)
		}
		if n := len(name) + 1 + len(value); n > maxEnvString {
			return fmt.Errorf("spec: secret env %s: %d bytes, more than the %d bytes an environment variable may hold", name, n, maxEnvString)
		}
	}
	if spec.Timeout < 0 || spec.IdleTimeout < 0 {
		return errors.New("spec: negative timeout")
	}
	if spec.Timeout == 0 {
		spec.Timeout = r.cfg.Timeout
	}
	if spec.TimeoutCap > 0 && spec.TimeoutCap < spec.Timeout {
		spec.Timeout = spec.TimeoutCap
	}
	if spec.IdleTimeout == 0 {
		spec.IdleTimeout = r.cfg.IdleTimeout
	}
	if spec.Redact == nil {
		spec.Redact = func(s string) string { return s }
	}
	return nil
}

// checkJobVars refuses inventory variables that would change how or where
// ssh connects.
func checkJobVars(vars map[string]any) error {
	for k := range vars {
		if !varNameRe.MatchString(k) {
			return fmt.Errorf("variable name %q", k)
		}
		if strings.HasPrefix(strings.ToLower(k), "ansible_") && !slices.Contains(jobHostVars, k) {
			return fmt.Errorf("variable %s: connection variables are the runner's", k)
		}
	}
	return nil
}

// RunJob runs js.PlaybookPath on js.Hosts; see the package comment and the
// comment of JobSpec. Errors and the Result are as for Run; the Result's
// Hosts hold every host's recap.
func (r *Runner) RunJob(ctx context.Context, js JobSpec) (*Result, error) {
	called := monoNow()
	keys, err := r.validateJob(&js)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	spec := &js.Spec
	log := r.log.With().Str("job_id", spec.JobID).Str("playbook", filepath.Base(js.PlaybookPath)).Int("hosts", len(js.Hosts)).Logger()
	if err := ctx.Err(); err != nil {
		now := time.Now()
		return &Result{Outcome: OutcomeCancelled, ExitCode: -1, Hosts: map[string]Recap{}, StartedAt: now, FinishedAt: now,
			Err: errors.New(spec.Redact(fmt.Sprintf("cancelled before start: %v", context.Cause(ctx))))}, nil
	}
	var steps Steps
	lap := newLapper()
	rd, err := r.newRunDir(spec.JobID, true)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := rd.remove(); err != nil {
			log.Error().Err(err).Msg("remove run dir")
		}
	}()
	if js.Dir != "" {
		if err := rd.handOver(js.Dir); err != nil {
			return nil, err
		}
		rd.binds = append(rd.binds, mount{path: js.Dir})
	}
	markers := jobMarkers(&js, keys)
	if err := rd.writeJobInputs(&js, keys, markers); err != nil {
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
	lap.to(&steps.Agent)

	spec.argv = r.jobArgv(rd, &js)
	spec.env = []string{
		// Host names are the caller's: no facts of another run.
		"ANSIBLE_CACHE_PLUGIN=memory",
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + filepath.Join(rd.tmpDir, "facts"),
		"ANSIBLE_INVENTORY_ENABLED=" + strings.Trim("ansible.builtin.yaml,"+js.InventoryEnabled, ","),
		"ANSIBLE_RETRY_FILES_ENABLED=False",
	}
	for _, name := range jobEnvNames {
		if v, ok := js.Env[name]; ok {
			spec.env = append(spec.env, name+"="+v)
		}
	}
	spec.Host.Alias = jobHostAlias // no one host: the events name the host
	// What earlier runs left on the hosts stops before the play starts
	// (a host whose scope's last run succeeded is skipped, see remote.go).
	takeover, stop := r.takeoverJob(ctx, rd, &js, keys, markers, log)
	lap.to(&steps.Takeover)
	// It ran before ansible-playbook's start: the play waited for all of it.
	steps.TakeoverWait = steps.Takeover
	if stop != nil {
		stop.Takeover, stop.Steps = takeover, steps
		return stop, nil
	}
	e := &execution{r: r, spec: spec, rd: rd, log: log}
	e.t.runCalled = called
	defer e.cleanup()
	if err := e.start(); err != nil {
		return nil, err
	}
	res, err := e.supervise(ctx, nil) // the takeover is done: no gate to open
	if e.deliverPanic != nil {
		panic(e.deliverPanic)
	}
	if err != nil {
		return nil, err
	}
	res.Takeover = takeover
	steps.Start = e.startTook()
	steps.Play = e.playTook()
	res.Steps = steps
	switch res.Outcome {
	case OutcomeCancelled, OutcomeTimeout, OutcomeIdleTimeout:
		stoppedRecap(res, &js, &e.events)
		// The play was stopped: so are its tasks on its hosts.
		res.Cleanup = r.cleanupJob(ctx, rd, &js, keys, markers, log)
	case OutcomeSucceeded:
		for _, m := range markers {
			if m != nil {
				r.markClean(ctx, *m, log)
			}
		}
	}
	return res, nil
}

// jobMarkers are the remote markers of a job's hosts (see remote.go): one
// per host that passed its check, none for a host whose variables (or any
// group's) choose their own ansible_python_interpreter, which the marker
// would replace.
func jobMarkers(js *JobSpec, keys []pinnedKey) []*remoteMarker {
	markers := make([]*remoteMarker, len(js.Hosts))
	for _, g := range js.Groups {
		if _, ok := g.Vars["ansible_python_interpreter"]; ok {
			return markers
		}
	}
	for i, h := range js.Hosts {
		if _, ok := h.Vars["ansible_python_interpreter"]; ok || h.Blocked {
			continue
		}
		scoped := h.Host
		if h.ScopeAlias != "" {
			scoped.Alias = h.ScopeAlias
		}
		m := newRemoteMarker(scoped, keys[i])
		markers[i] = &m
	}
	return markers
}

// takeoverJob runs the takeover (remote.go) on each marked host whose
// scope is not marked clean, a few at a time, and sums up what was
// stopped. It returns the Result of a job that must not start: a host's
// takeover failed (a process survived, or it could not run) or ctx ended.
// A host it cannot connect to is left to the play, which finds it
// unreachable.
func (r *Runner) takeoverJob(ctx context.Context, rd *runDir, js *JobSpec, keys []pinnedKey, markers []*remoteMarker, log zerolog.Logger) (*RemoteReport, *Result) {
	return r.eachMarked(ctx, js, markers, func(hs *Spec, i int) (*RemoteReport, *Result) {
		hlog := log.With().Str("host", hs.Host.Alias).Logger()
		if r.leftClean(ctx, *markers[i], hlog) {
			hlog.Debug().Msg("takeover skipped: the host's last run of the scope succeeded")
			return &RemoteReport{Skipped: true}, nil
		}
		return r.takeover(ctx, rd, hs, keys[i], *markers[i], hlog)
	})
}

// eachMarked runs fn for every marked host of js (eight at a time), with a
// copy of js's Spec aimed at the host, and sums up the reports; the first
// Result fn returns wins.
func (r *Runner) eachMarked(ctx context.Context, js *JobSpec, markers []*remoteMarker, fn func(hs *Spec, i int) (*RemoteReport, *Result)) (*RemoteReport, *Result) {
	total := &RemoteReport{Privileged: true, Skipped: true}
	var stop *Result
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, m := range markers {
		if m == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			hs := js.Spec
			hs.Host = js.Hosts[i].Host
			rep, res := fn(&hs, i)
			mu.Lock()
			defer mu.Unlock()
			if res != nil && stop == nil {
				stop = res
			}
			if rep == nil {
				return
			}
			total.Stopped += rep.Stopped
			total.Killed += rep.Killed
			total.Left += rep.Left
			total.Runs = append(total.Runs, rep.Runs...)
			total.Dirs += rep.Dirs
			total.Privileged = total.Privileged && (rep.Privileged || rep.Skipped)
			total.Skipped = total.Skipped && rep.Skipped
			total.Duration = max(total.Duration, rep.Duration)
		}()
	}
	wg.Wait()
	return total, stop
}

// cleanupJob stops the tasks of a stopped job on each of its marked hosts
// (a few at a time) and sums up what was stopped.
func (r *Runner) cleanupJob(ctx context.Context, rd *runDir, js *JobSpec, keys []pinnedKey, markers []*remoteMarker, log zerolog.Logger) *RemoteReport {
	rep, _ := r.eachMarked(ctx, js, markers, func(hs *Spec, i int) (*RemoteReport, *Result) {
		return r.cleanupRemote(ctx, rd, hs, keys[i], *markers[i], log.With().Str("host", hs.Host.Alias).Logger()), nil
	})
	rep.Skipped = false
	return rep
}

// jobArgv is a job's command line: only paths and validated options.
func (r *Runner) jobArgv(rd *runDir, js *JobSpec) []string {
	argv := []string{r.cfg.PlaybookBin}
	if js.InventoryFile != "" {
		argv = append(argv, "-i", js.InventoryFile)
	}
	argv = append(argv, "-i", rd.inventory, "-e", "@"+rd.vars)
	if len(js.SecretVars) > 0 {
		argv = append(argv, "-e", "@"+filepath.Join(rd.path, secretVarsFile))
	}
	if js.VaultPassword != "" {
		argv = append(argv, "--vault-password-file="+filepath.Join(rd.path, "vault-pass"))
	}
	o := js.Options
	if len(o.Tags) > 0 {
		argv = append(argv, "--tags="+strings.Join(o.Tags, ","))
	}
	if len(o.SkipTags) > 0 {
		argv = append(argv, "--skip-tags="+strings.Join(o.SkipTags, ","))
	}
	if o.Limit != "" {
		argv = append(argv, "--limit="+o.Limit)
	}
	if o.Check {
		argv = append(argv, "--check")
	}
	if o.Diff {
		argv = append(argv, "--diff")
	}
	if o.Verbosity > 0 {
		argv = append(argv, "-"+strings.Repeat("v", o.Verbosity))
	}
	if o.Forks > 0 {
		argv = append(argv, "--forks="+strconv.Itoa(o.Forks))
	}
	return append(argv, js.PlaybookPath)
}

// vaultScript prints the vault password from the environment: Ansible runs
// an executable --vault-password-file and reads its output, so the password
// never touches the disk.
const vaultScript = "#!/bin/sh\nexec /usr/bin/printenv " + envVaultPassword + "\n"

// writeJobInputs writes a job's inventory, known_hosts, vars and vault
// script.
func (d *runDir) writeJobInputs(js *JobSpec, keys []pinnedKey, markers []*remoteMarker) error {
	var inv, known strings.Builder
	inv.WriteString("all:\n  hosts:\n")
	for i, h := range js.Hosts {
		ssh := []string{"-F /dev/null", "-o UserKnownHostsFile=" + d.knownHosts, "-o GlobalKnownHostsFile=/dev/null",
			"-o StrictHostKeyChecking=yes"}
		if h.Blocked {
			// No packet leaves for a host that failed its check.
			ssh = append(ssh, "-o ProxyCommand=/bin/false")
		} else {
			ssh = append(ssh, "-o HostKeyAlgorithms="+keys[i].algorithms)
			known.WriteString(knownHostsLine(h.Host, keys[i]))
		}
		fmt.Fprintf(&inv, "    %s:\n      ansible_host: !unsafe %s\n      ansible_port: %d\n      ansible_user: !unsafe %s\n"+
			"      ansible_ssh_common_args: !unsafe %s\n      ansible_connection: ssh\n",
			quoted(h.Alias), quoted(h.Address), h.Port, quoted(h.User), quoted(strings.Join(ssh, " ")))
		if m := markers[i]; m != nil {
			fmt.Fprintf(&inv, "      ansible_python_interpreter: !unsafe %s\n      ansible_remote_tmp: !unsafe %s\n",
				quoted(m.interpreter()), quoted(m.remoteTmp()))
		}
		if err := writeJobVars(&inv, "      ", h.Vars); err != nil {
			return fmt.Errorf("host %s: %w", h.Alias, err)
		}
	}
	if js.BecomePassword != "" {
		inv.WriteString("  vars:\n    ansible_become_password: \"{{ lookup('env', '" + envBecomePassword + "') }}\"\n")
	}
	if len(js.Groups) > 0 {
		inv.WriteString("  children:\n")
		for _, name := range sortedKeys(js.Groups) {
			g := js.Groups[name]
			fmt.Fprintf(&inv, "    %s:\n", quoted(name))
			if len(g.Hosts) > 0 {
				inv.WriteString("      hosts:\n")
				for _, h := range g.Hosts {
					fmt.Fprintf(&inv, "        %s: {}\n", quoted(h))
				}
			}
			if len(g.Children) > 0 {
				inv.WriteString("      children:\n")
				for _, c := range g.Children {
					fmt.Fprintf(&inv, "        %s: {}\n", quoted(c))
				}
			}
			if len(g.Vars) > 0 {
				inv.WriteString("      vars:\n")
				if err := writeJobVars(&inv, "        ", g.Vars); err != nil {
					return fmt.Errorf("group %s: %w", name, err)
				}
			}
		}
	}
	if err := d.writeFile(d.inventory, []byte(inv.String())); err != nil {
		return fmt.Errorf("write inventory: %w", err)
	}
	if err := d.writeFile(d.knownHosts, []byte(known.String())); err != nil {
		return fmt.Errorf("write known_hosts: %w", err)
	}
	vars, err := unsafeYAML(js.Vars)
	if err != nil {
		return err
	}
	if err := d.writeFile(d.vars, []byte(vars)); err != nil {
		return fmt.Errorf("write vars: %w", err)
	}
	if len(js.SecretVars) > 0 {
		if err := d.writeFile(filepath.Join(d.path, secretVarsFile), []byte(secretVarsYAML(js.SecretVars))); err != nil {
			return fmt.Errorf("write secret vars: %w", err)
		}
	}
	if js.VaultPassword != "" {
		path := filepath.Join(d.path, "vault-pass")
		if err := d.writeFile(path, []byte(vaultScript)); err != nil {
			return fmt.Errorf("write vault password script: %w", err)
		}
		if err := os.Chmod(path, 0o700); err != nil {
			return fmt.Errorf("vault password script: %w", err)
		}
	}
	return nil
}

// secretVarsYAML is the vars file of a job's secret vars: no value, only
// each name's lookup of its environment variable (validateJob numbers
// them in the same sorted order). The lookup is templated; its result is
// unsafe (lookups' allow_unsafe is off), so the value is not.
func secretVarsYAML(vars map[string]string) string {
	var b strings.Builder
	for i, k := range sortedKeys(vars) {
		fmt.Fprintf(&b, "%s: \"{{ lookup('ansible.builtin.env', '%s%d') }}\"\n", k, envSecretVar, i)
	}
	return b.String()
}

// asAny is vars as a map of any (for checkJobVars).
func asAny(vars map[string]string) map[string]any {
	out := make(map[string]any, len(vars))
	for k, v := range vars {
		out[k] = v
	}
	return out
}

// writeJobVars writes vars as block-mapping lines at indent, each value a
// flow value with every string !unsafe.
func writeJobVars(b *strings.Builder, indent string, vars map[string]any) error {
	for _, k := range sortedKeys(vars) {
		b.WriteString(indent)
		writeKey(b, k)
		if err := writeYAMLValue(b, reflect.ValueOf(vars[k]), 1); err != nil {
			return fmt.Errorf("variable %s: %w", k, err)
		}
		b.WriteByte('\n')
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// stoppedRecap completes the result of a job's play that was stopped
// (cancelled, timed out): every host the play was for has a recap, those
// that had done nothing yet with zeros, and the task that was running
// names the hosts still on it (those without a result for it that had not
// left the play), not "a host of the job". With a limit the play's hosts
// are not known: only hosts seen in events count then.
func stoppedRecap(res *Result, js *JobSpec, ev *eventState) {
	var running []string
	for _, h := range js.Hosts {
		name := h.Alias
		rc, seen := res.Hosts[name]
		if h.Blocked || (!seen && js.Options.Limit != "") {
			continue
		}
		if !seen {
			res.Hosts[name] = Recap{}
		}
		if !ev.answered[name] && rc.Failed == 0 && rc.Unreachable == 0 {
			running = append(running, name)
		}
	}
	if ft := res.FailedTask; ft != nil && ft.Host == "" && len(running) > 0 {
		const shown = 5
		ft.Host = strings.Join(running[:min(len(running), shown)], ", ")
		if len(running) > shown {
			ft.Host += fmt.Sprintf(" and %d more", len(running)-shown)
		}
	}
}
