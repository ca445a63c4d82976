package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// Ansible jobs (messages.AnsibleJobMessage, issue 23): any playbook, role or
// collection role on any inventory, read from ansible:job:queue and the pool
// streams this instance serves. They go the deploy path's way, on many
// hosts:
//
//  1. Decode and validate (rejected result and dead letter on bad input); a
//     job read from another pool's stream than its options.pool is
//     rejected too.
//  2. A job already done gets its stored result again.
//  3. Every secret reference (options.secret_vars' too) is authorized for
//     the job's project (as a deploy's), before anything is resolved or
//     fetched.
//  4. The inventory is resolved to hosts, and every host authorized like a
//     deploy target (registered, or in the operator's allow-list; never a
//     loopback, link-local, metadata or own address) before any
//     connection: one refused host ends the job, nothing dialed.
//  5. The source is checked out into the job's private directory at the
//     resolved commit; a path that leaves the checkout is rejected.
//  6. The job and every host's lock are taken at once, in one global order
//     (store.Locker.AcquireAll); a busy host makes the request wait pending
//     in the stream, outside the concurrency slots.
//  7. Each host gets its SSH check (pinning its key on first use); a host
//     that fails it stays in the inventory but unreachable, so the others go
//     on and the recap shows it.
//  8. The playbooks run in order (ansible.Runner.RunJob), each only when the
//     one before succeeded, with progress events, cancel, time limits,
//     redaction and the full log, as for deploys; the result (per playbook,
//     per host, with the commit) is stored with the run and published on
//     job:results. Secret vars are resolved for each run, just before it,
//     and reach the play through the environment only (JobSpec.SecretVars).

// kindJob is the run kind (runs.kind) of Ansible jobs.
const kindJob = string(messages.JobKindJob)

// DefaultPool names the default pool (StreamAnsibleJobQueue) in
// AnsibleJobsConfig.Pools.
const DefaultPool = "default"

// JobRunner runs a job's playbook on many hosts (ansible.Runner.RunJob).
type JobRunner interface {
	RunJob(ctx context.Context, spec ansible.JobSpec) (*ansible.Result, error)
}

// JobSources checks out the repositories of Ansible jobs.
type JobSources interface {
	// Checkout writes the files of url at ref ("" for its default branch)
	// into dst, a new directory, reading it with token ("" for none), and
	// returns the full commit id checked out.
	Checkout(ctx context.Context, url, ref, token, dst string) (commit string, err error)
	// SafePath returns the path of rel inside root, refusing (with an error
	// for the requester) a path that leaves it: "..", absolute, or through
	// a symlink that points out.
	SafePath(root, rel string) (string, error)
}

// AnsibleJobsConfig configures the handling of Ansible jobs.
type AnsibleJobsConfig struct {
	// Pools this instance serves: DefaultPool for StreamAnsibleJobQueue,
	// other names for AnsibleJobQueue(name).
	Pools []string
	// PoolAccess is the operator's grant of named pools to projects
	// (JOB_POOL_PROJECTS): a job of a project its pool is not granted to
	// is rejected before anything of it is fetched. The zero value grants
	// no named pool.
	PoolAccess authz.Pools
	// WorkDir is the parent of the jobs' private directories (checkouts,
	// generated plays); created 0700 when missing.
	WorkDir string
	// MaxHosts is the most hosts a job may have (0: messages.MaxJobHosts).
	MaxHosts int
	// Sources checks out the jobs' repositories.
	Sources JobSources
	// Inventories resolves git, URL and dynamic inventories; nil: inline
	// inventories only.
	Inventories JobInventories
	// Galaxy installs requirements and collection roles; nil: jobs that
	// need them are rejected.
	Galaxy JobGalaxy
	// GalaxyServers are the allowed Galaxy servers, the first the default:
	// the job's Galaxy credential goes to the one its source names only.
	GalaxyServers []GalaxyServer
	// SSHChecks is how many hosts of a job are checked at once (0: 8).
	SSHChecks int
	// Prepared is how many waiting jobs' preparations (checkouts,
	// inventories, requirements) this instance keeps for their next look
	// (0: 32), PreparedTTL how long one is kept (0: 15 minutes); see
	// prepared.go.
	Prepared    int
	PreparedTTL time.Duration
	// OtherUsers: plays run as other users than this process (the
	// runner's RunsAsOthers); WorkDir is then traversable (0711), not
	// listable. The runner hands each job's directory to its run's user.
	OtherUsers bool
}

// GalaxyServer is an allowed Galaxy server, by name and URL.
type GalaxyServer struct{ Name, URL string }

// JobStreams returns the streams of pools (see AnsibleJobsConfig.Pools).
func JobStreams(pools []string) []string {
	var out []string
	for _, p := range pools {
		if p == DefaultPool {
			p = ""
		}
		s := messages.AnsibleJobQueue(p)
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// DropPrepared removes what waiting Ansible jobs prepared (prepared.go):
// at shutdown, once the consumer stopped.
func (h *Handler) DropPrepared() {
	if h.prepared != nil {
		h.prepared.close()
	}
}

// ServeAnsibleJobs routes the streams of cfg.Pools to the Ansible job
// handler and returns them, for the consumer to read. Call it before the
// consumer starts. The Runner must implement JobRunner.
func (h *Handler) ServeAnsibleJobs(cfg AnsibleJobsConfig) ([]string, error) {
	runner, ok := h.Runner.(JobRunner)
	if !ok {
		return nil, errors.New("jobs: the runner cannot run Ansible jobs")
	}
	if cfg.Sources == nil || cfg.WorkDir == "" {
		return nil, errors.New("jobs: Ansible jobs need sources and a work directory")
	}
	for _, p := range cfg.Pools {
		if p != DefaultPool && !messages.ValidPool(p) {
			return nil, fmt.Errorf("jobs: pool %q: want %s or %s", p, DefaultPool, messages.PoolPattern)
		}
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("jobs: work dir: %w", err)
	}
	mode := os.FileMode(0o700)
	if cfg.OtherUsers {
		mode = 0o711
	}
	if err := os.Chmod(cfg.WorkDir, mode); err != nil {
		return nil, fmt.Errorf("jobs: work dir: %w", err)
	}
	h.prepared = newPreparedJobs(cfg.Prepared, cfg.PreparedTTL)
	cfg.MaxHosts = cmp.Or(cfg.MaxHosts, messages.MaxJobHosts)
	cfg.SSHChecks = cmp.Or(cfg.SSHChecks, 8)
	streams := JobStreams(cfg.Pools)
	for _, s := range streams {
		h.routes.RouteFunc(s, func(ctx context.Context, msg *stream.Message) error {
			return h.handleAnsibleJob(ctx, msg, &cfg, runner)
		})
	}
	return streams, nil
}

// handleAnsibleJob handles an AnsibleJobMessage (see the top of this file).
func (h *Handler) handleAnsibleJob(ctx context.Context, msg *stream.Message, cfg *AnsibleJobsConfig, runner JobRunner) (retErr error) {
	began := time.Now()
	m, err := messages.DecodeAnsibleJobMessage(msg.Data())
	res := messages.NewAnsibleJobResult(m, msg.ID)
	j := h.newJob(msg, kindJob, res, &res.Outcome, messages.StreamJobResults)
	defer j.close()
	var tc *messages.TraceContext
	if m != nil {
		tc = &m.TraceContext
	}
	ctx = j.startTrace(ctx, traceOf(tc), began, err)
	if err != nil {
		return j.reject(ctx, err)
	}
	if want := messages.AnsibleJobQueue(m.Options.Pool); msg.Stream != want {
		return j.reject(ctx, &messages.ValidationError{Fields: []messages.FieldError{{Field: "options.pool",
			Message: fmt.Sprintf("the job names pool %q but was read from %s: append it to %s", m.Options.Pool, msg.Stream, want)}}})
	}
	if err := cfg.PoolAccess.Check(m.Options.Pool, m.ProjectID); err != nil {
		return j.reject(ctx, &messages.ValidationError{Fields: []messages.FieldError{{Field: "options.pool", Message: err.Error()}}})
	}
	j.log = j.log.With().Str("project_id", m.ProjectID).Str("pool", m.Options.Pool).Logger()
	j.timeoutCap = time.Duration(m.Options.TimeoutSeconds) * time.Second

	// A job done already is answered from its row, without fetching
	// anything again; runLocked makes the same check under the lock.
	if r, err := store.GetRun(ctx, h.DB, j.id); err == nil && r.State == store.RunDone {
		if r.Kind != j.kind {
			return j.kindConflict(ctx, r)
		}
		return j.republish(ctx, r)
	}

	aj := &ansibleJob{job: j, m: m, cfg: cfg, runner: runner, result: res}
	at := j.steps.add(stepDecode, began)
	if err := aj.checkRefs(ctx); err != nil {
		return aj.early(ctx, err)
	}
	j.steps.add(stepAuthorization, at)
	// What an earlier look of this request prepared before it found its
	// hosts busy (prepared.go), or a new directory.
	entry := stream.Entry{Stream: msg.Stream, ID: msg.ID}
	aj.prep = h.prepared.take(entry, h.Now())
	if aj.prep == nil {
		dir, err := os.MkdirTemp(cfg.WorkDir, "job-")
		if err != nil {
			return j.infraError(ctx, fmt.Errorf("job dir: %w", err))
		}
		aj.prep = &preparedJob{dir: dir}
	} else {
		j.log.Debug().Bool("inventory", aj.prep.inv != nil).Bool("source", aj.prep.src != nil).
			Msg("prepared at an earlier look: not fetched again")
	}
	defer func() {
		if errors.Is(retErr, store.ErrTargetBusy) {
			h.prepared.keep(entry, aj.prep, h.Now()) // it looks again
			return
		}
		h.prepared.drop(aj.prep)
	}()
	aj.dir = aj.prep.dir
	// A dynamic inventory's plugin may come from the source's
	// requirements: its source is checked out (and they installed) first.
	// Any other job fetches nothing before its hosts are authorized.
	sourceFirst := m.Inventory.Type == messages.InventoryDynamic
	if sourceFirst {
		if err := aj.checkout(ctx); err != nil {
			return aj.early(ctx, err)
		}
	}
	at = time.Now()
	if err := aj.resolveHosts(ctx); err != nil {
		return aj.early(ctx, err)
	}
	at = j.steps.add(stepInventory, at)
	if err := aj.authorizeHosts(ctx); err != nil {
		return aj.early(ctx, err)
	}
	j.steps.add(stepAuthorization, at)
	j.targets = aj.targets()
	if !sourceFirst {
		// A job whose hosts another run holds waits before its checkout
		// (and requirements), not after: it comes back until they are
		// free and prepares once (a probe; runLocked takes the locks).
		// A free probe reserves the hosts (their lines) for the checkout's
		// time; a checkout that fails gives them up at once.
		at := time.Now()
		busy, err := h.Locker.Busy(ctx, store.Waiter{Job: j.id, Stream: msg.Stream, Entry: msg.ID}, j.targets)
		j.steps.add(stepLocks, at)
		if err == nil && busy {
			return j.waitBusy(ctx, strings.Join(j.targets, " "), store.ErrTargetBusy)
		}
		if err := aj.checkout(ctx); err != nil {
			if lerr := store.LeaveLines(ctx, h.DB, j.id); lerr != nil {
				j.log.Warn().Err(lerr).Msg("could not leave the lines: its places go stale")
			}
			return aj.early(ctx, err)
		}
	}
	return j.runLocked(ctx, strings.Join(j.targets, " "), aj.label(), aj.run)
}

// ansibleJob is one Ansible job being handled.
type ansibleJob struct {
	*job
	m      *messages.AnsibleJobMessage
	cfg    *AnsibleJobsConfig
	runner JobRunner
	result *messages.AnsibleJobResult

	prep      *preparedJob // what it prepared, at this look or an earlier one
	dir       string       // the job's private directory (prep.dir)
	hosts     []*jobHost   // in the inventory's order
	groups    map[string]ansible.JobGroup
	playbooks []string // absolute paths in the checkout, in order
	names     []string // the playbooks as the result names them
	vars      map[string]any

	env        map[string]string // where the job's requirements are (ANSIBLE_*_PATH)
	invFile    string            // a resolved git or URL inventory ("": none)
	invEnabled string            // the inventory plugin that reads it
}

// early ends a job before its run: an outcome is published (rejections
// dead-letter the entry), anything else is an infrastructure error.
func (aj *ansibleJob) early(ctx context.Context, err error) error {
	if messages.IsInvalid(err) {
		return aj.reject(ctx, err)
	}
	if o, ok := asOutcome(err); ok {
		return aj.end(ctx, o)
	}
	return aj.infraError(ctx, err)
}

// label names the job's run (runs.playbook): its playbooks, its role or its
// collection role.
func (aj *ansibleJob) label() string {
	s := aj.m.Source
	switch s.Type {
	case messages.SourceRole:
		return "role " + s.RolePath
	case messages.SourceCollectionRole:
		return "role " + s.Collection + "." + s.Role
	}
	return strings.Join(s.Paths, ", ")
}

// refField is a secret reference of the request and the key it came in.
type refField struct{ field, ref string }

// refs lists the request's secret references.
func (aj *ansibleJob) refs() []refField {
	m := aj.m
	all := []refField{
		{"source.git_credential", m.Source.GitCredential},
		{"inventory.credential", m.Inventory.Credential},
		{"credentials.ssh", m.Credentials.SSH},
		{"credentials.become_password", m.Credentials.BecomePassword},
		{"credentials.vault_password", m.Credentials.VaultPassword},
		{"credentials.cloud", m.Credentials.Cloud},
		{"credentials.galaxy", m.Credentials.Galaxy},
	}
	for _, name := range slices.Sorted(maps.Keys(m.Options.SecretVars)) {
		all = append(all, refField{secretVarField(name), m.Options.SecretVars[name]})
	}
	return slices.DeleteFunc(all, func(r refField) bool { return r.ref == "" })
}

// secretVarField is the request key of the secret var name.
func secretVarField(name string) string { return "options.secret_vars[" + name + "]" }

// secretVars resolves the job's secret vars (options.secret_vars, already
// authorized) with the project resolver, which registers every value with
// the job's redactor. They are resolved for each run, under its locks, and
// kept nowhere else: not in what a waiting job prepared (prepared.go).
func (aj *ansibleJob) secretVars(ctx context.Context) (map[string]string, error) {
	sv := aj.m.Options.SecretVars
	if len(sv) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(sv))
	for _, name := range slices.Sorted(maps.Keys(sv)) {
		v, err := aj.secret(ctx, secretVarField(name), sv[name])
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// checkRefs authorizes every reference of the request for its project
// before anything is resolved: the same rule as a deploy's.
func (aj *ansibleJob) checkRefs(ctx context.Context) error {
	refs := aj.refs()
	if len(refs) == 0 {
		return nil
	}
	own, err := aj.ownRefs(ctx)
	if err != nil {
		return err
	}
	for _, r := range refs {
		if _, err := aj.h.Authz.Ref(aj.m.ProjectID, r.field, r.ref, own); err != nil {
			aj.log.Warn().Str("field", r.field).Str("reason", err.Error()).Msg("secret reference refused: nothing resolved, nothing dialed")
			return fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
		}
	}
	return nil
}

// secret resolves one of the request's references (already authorized)
// with the project resolver; "" for an absent one.
func (aj *ansibleJob) secret(ctx context.Context, field, ref string) (string, error) {
	if ref == "" {
		return "", nil
	}
	v, err := aj.resolveWith(ctx, aj.project, field, ref)
	if err != nil {
		return "", err
	}
	defer v.Wipe()
	return v.Reveal(), nil
}

// targets returns the lock keys of the job's hosts.
func (aj *ansibleJob) targets() []string {
	out := make([]string, 0, len(aj.hosts))
	for _, h := range aj.hosts {
		out = append(out, h.target)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkout checks the source out, installs its requirements and finds the
// playbooks to run, once per request (prepared.go).
func (aj *ansibleJob) checkout(ctx context.Context) error {
	s := aj.m.Source
	aj.vars = map[string]any{}
	for k, v := range aj.m.Options.ExtraVars {
		aj.vars[k] = v
	}
	if c := aj.prep.src; c != nil {
		aj.useCheckout(c)
		return nil
	}
	src := ""
	at := time.Now()
	if s.Type != messages.SourceCollectionRole {
		token, err := aj.secret(ctx, "source.git_credential", s.GitCredential)
		if err != nil {
			return err
		}
		src = aj.dir + "/src"
		commit, err := aj.cfg.Sources.Checkout(ctx, s.Repository, s.Ref, token, src)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			aj.log.Warn().Str("error", aj.red.RedactString(err.Error())).Msg("source checkout failed")
			if field := checkoutField(err); field != "" {
				return &messages.ValidationError{Fields: []messages.FieldError{{Field: field, Message: aj.red.RedactString(err.Error())}}}
			}
			return fail(messages.StatusFailed, messages.KindInternal, "source %s at %q: %s", s.Repository, s.Ref, aj.red.RedactString(err.Error()))
		}
		aj.result.Commit = commit
		aj.log = aj.log.With().Str("commit", commit).Logger()
	}
	at = aj.steps.add(stepCheckout, at)
	env, err := aj.installRequirements(ctx, src)
	if err != nil {
		return err
	}
	at = aj.steps.add(stepRequirements, at)
	defer aj.steps.add(stepPlaybooks, at)
	aj.env = env
	switch s.Type {
	case messages.SourceRole:
		roleDir, err := aj.cfg.Sources.SafePath(src, s.RolePath)
		if err != nil {
			return &messages.ValidationError{Fields: []messages.FieldError{{Field: "source.role_path", Message: err.Error()}}}
		}
		play := aj.dir + "/role-play.yml"
		if err := sources.RolePlay(play, roleDir, s.RoleVars, sources.PlayOptions{GatherFacts: true}); err != nil {
			return &messages.ValidationError{Fields: []messages.FieldError{{Field: "source.role_path", Message: err.Error()}}}
		}
		aj.playbooks, aj.names = []string{play}, []string{s.RolePath}
	case messages.SourceCollectionRole:
		fqcn := s.Collection + "." + s.Role
		play := aj.dir + "/role-play.yml"
		if err := sources.CollectionRolePlay(play, fqcn, s.RoleVars, sources.PlayOptions{GatherFacts: true}); err != nil {
			return &messages.ValidationError{Fields: []messages.FieldError{{Field: "source.role", Message: err.Error()}}}
		}
		aj.playbooks, aj.names = []string{play}, []string{fqcn}
	default:
		var fields []messages.FieldError
		for i, p := range s.Paths {
			path, err := aj.cfg.Sources.SafePath(src, p)
			if err == nil {
				if st, serr := os.Stat(path); serr != nil || !st.Mode().IsRegular() {
					err = errors.New("no such playbook in the repository")
				}
			}
			if err != nil {
				fields = append(fields, messages.FieldError{Field: fmt.Sprintf("source.paths[%d]", i), Message: err.Error()})
				continue
			}
			aj.playbooks, aj.names = append(aj.playbooks, path), append(aj.names, p)
		}
		if len(fields) > 0 {
			return &messages.ValidationError{Fields: fields}
		}
	}
	aj.prep.src = &checkedOut{commit: aj.result.Commit, env: aj.env, playbooks: aj.playbooks, names: aj.names}
	return nil
}

// useCheckout takes the checkout an earlier look made (prepared.go).
func (aj *ansibleJob) useCheckout(c *checkedOut) {
	aj.env, aj.playbooks, aj.names = c.env, c.playbooks, c.names
	if c.commit != "" {
		aj.result.Commit = c.commit
		aj.log = aj.log.With().Str("commit", c.commit).Logger()
	}
}

// checkoutField names the request key a checkout error is the fault of
// (the request is then rejected), or "" for a failure to retry or report.
func checkoutField(err error) string {
	switch {
	case errors.Is(err, sources.ErrURL), errors.Is(err, authz.ErrDenied): // at an address infra may not reach
		return "source.repository"
	case errors.Is(err, sources.ErrRef):
		return "source.ref"
	case errors.Is(err, sources.ErrPath):
		return "source.repository" // a symlink in the repository points out of it
	}
	return ""
}

// run is the job's run under its locks: credentials, SSH checks, the
// playbooks in order.
func (aj *ansibleJob) run(ctx context.Context) (*outcome, error) {
	at := time.Now()
	keys, err := aj.sshKeys(ctx)
	if err != nil {
		return nil, err
	}
	aj.steps.add(stepSecrets, at)
	if err := aj.checkHosts(ctx, keys); err != nil {
		return nil, err
	}
	if aj.allBlocked() {
		return aj.blockedOutcome(), nil
	}
	at = time.Now()
	vault, err := aj.secret(ctx, "credentials.vault_password", aj.m.Credentials.VaultPassword)
	if err != nil {
		return nil, err
	}
	become, err := aj.secret(ctx, "credentials.become_password", aj.m.Credentials.BecomePassword)
	if err != nil {
		return nil, err
	}
	secretVars, err := aj.secretVars(ctx)
	if err != nil {
		return nil, err
	}
	aj.steps.add(stepSecrets, at)
	spec := ansible.JobSpec{
		Spec: ansible.Spec{
			JobID: aj.id, Vars: aj.vars, SSHKeys: keys.all, Redact: aj.red.RedactString,
			TimeoutCap: aj.timeoutCap, OnOutput: aj.onOutput(), OnEvent: aj.prog.fromAnsible, OnStart: aj.onStart,
		},
		Dir:              aj.dir,
		Hosts:            aj.jobHosts(),
		Groups:           aj.groups,
		InventoryFile:    aj.invFile,
		InventoryEnabled: aj.invEnabled,
		Env:              aj.env,
		VaultPassword:    vault,
		BecomePassword:   become,
		SecretVars:       secretVars,
		Options: ansible.JobOptions{Tags: aj.m.Options.Tags, SkipTags: aj.m.Options.SkipTags, Limit: aj.m.Options.Limit,
			Check: aj.m.Options.Check, Diff: aj.m.Options.Diff, Verbosity: aj.m.Options.Verbosity, Forks: aj.m.Options.Forks},
	}
	var last *outcome
	total := map[string]ansible.Recap{}
	artifacts := messages.Vars{}
	defer func() {
		if dropped := aj.result.SetArtifacts(artifacts); len(dropped) > 0 {
			aj.log.Warn().Strs("artifacts", dropped).Msg("set_stats data left out of the result: not a variable name, or over the size limit")
		}
	}()
	for i, path := range aj.playbooks {
		name := aj.names[i]
		if last != nil && !last.succeeded() {
			aj.result.Playbooks = append(aj.result.Playbooks, messages.PlaybookOutcome{Playbook: name, Status: messages.PlaybookSkipped})
			continue
		}
		spec.PlaybookPath = path
		aj.log.Info().Str("playbook", name).Int("hosts", len(spec.Hosts)).Msg("starting playbook")
		res, err := aj.runner.RunJob(ctx, spec)
		if errors.Is(err, ansible.ErrInvalidSpec) {
			return nil, fail(messages.StatusFailed, messages.KindInternal, "%s cannot run: %v", name, err)
		}
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", name, err)
		}
		aj.steps.addRun(res.Steps)
		maps.Copy(artifacts, res.Artifacts)
		aj.playEnded = cmp.Or(res.ExitedAt, res.FinishedAt)
		aj.job.reportRemote(res, "the job's hosts", nil)
		for h, r := range res.Hosts {
			t := total[h]
			total[h] = ansible.Recap{OK: t.OK + r.OK, Changed: t.Changed + r.Changed, Failed: t.Failed + r.Failed,
				Unreachable: t.Unreachable + r.Unreachable, Skipped: t.Skipped + r.Skipped, Rescued: t.Rescued + r.Rescued,
				Ignored: t.Ignored + r.Ignored}
		}
		last = aj.verdict(name, res, total)
		step := messages.PlaybookOutcome{Playbook: name, Status: messages.PlaybookStatus(last.status), ErrorKind: last.kind}
		if last.status == messages.StatusFailed && last.kind == messages.KindHostsUnreachable {
			step.Status = messages.PlaybookUnreachable
		}
		if !res.StartedAt.IsZero() && res.FinishedAt.After(res.StartedAt) {
			step.DurationMS = res.FinishedAt.Sub(res.StartedAt).Milliseconds()
		}
		aj.result.Playbooks = append(aj.result.Playbooks, step)
	}
	return last, nil
}

// verdict is the outcome of a job after the playbook name ran with res;
// total is the recap of every playbook so far. A failed task fails the
// job; hosts that were unreachable while others were not fail it with kind
// hosts_unreachable; every host unreachable makes it unreachable.
func (aj *ansibleJob) verdict(name string, res *ansible.Result, total map[string]ansible.Recap) *outcome {
	// The recap of the job so far, and hosts the play never saw (blocked
	// hosts a limit left out are not there: only those it reached for).
	merged := *res
	merged.Hosts = total
	o := playOutcome(name, &merged)
	switch res.Outcome {
	case ansible.OutcomeSucceeded, ansible.OutcomeFailed, ansible.OutcomeUnreachable:
	default:
		return o // stopped, timed out, or an error of its own
	}
	var failed, unreachable, reached int
	for _, r := range total {
		switch {
		case r.Failed > 0:
			failed++
		case r.Unreachable > 0:
			unreachable++
		default:
			reached++
		}
	}
	switch {
	case failed > 0:
		o.status, o.kind = messages.StatusFailed, messages.KindPlaybookFailed
	case unreachable > 0 && reached == 0:
		o.status, o.kind = messages.StatusUnreachable, messages.KindHostsUnreachable
		o.message = fmt.Sprintf("%s: no host was reachable", name)
	case unreachable > 0:
		o.status, o.kind = messages.StatusFailed, messages.KindHostsUnreachable
		o.message = fmt.Sprintf("%s: %d of %d hosts unreachable", name, unreachable, len(total))
	case res.Outcome == ansible.OutcomeSucceeded:
	default:
		o.status, o.kind = messages.StatusFailed, messages.KindPlaybookFailed
	}
	return o
}
