// Package jobs turns each provisioning or deploy request into a safe,
// observable Ansible run and a typed result.
//
// The flow of one request (see Handler.Handle):
//
//  1. Decode and validate. Invalid input gets a rejected result, and the
//     entry is dead-lettered (stream.Permanent): never a crash or a retry.
//  2. Idempotency: a job id already done gets its stored result published
//     again; a job running elsewhere (its job lock is held) is left alone.
//  3. Locks that die with their holder (Postgres session locks): the job's,
//     and the target server's, so that at most one run per server happens at
//     any time across all instances.
//  4. Server lookup (on the canonical address), provider refresh
//     (Time4VPS); for a deploy, authorization (package authz) of the target
//     and of the request's secret references before anything is resolved
//     or dialed; SSH credentials from the service's own references, SSH
//     check with retries (a server still down is marked UNREACHABLE and
//     nothing runs); then the request's secrets, from the project resolver.
//  5. The playbook run (package ansible) with progress events published on
//     the job's own stream.
//  6. The result is stored with the run (runs table) and the server's state
//     in one transaction, then published, then the entry is acknowledged.
//     A redelivered entry thus finds the stored result and re-publishes it.
//
// Failed playbooks are not retried: the result says why. Infrastructure
// errors (Postgres, Redis, Vault unavailable) are retried by the stream
// runtime with backoff; on the last allowed delivery they become a failed
// result instead of a dead letter, so no run stays "running" forever.
package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// Runner runs one playbook (package ansible).
type Runner interface {
	Run(ctx context.Context, spec ansible.Spec) (*ansible.Result, error)
	// ForgetHost drops the cached facts of a host (its OS was rebuilt).
	ForgetHost(alias string)
	// CloseWarm closes the warm SSH connections to a host (its SSH check
	// failed, its OS was rebuilt); nothing when they are off.
	CloseWarm(alias string)
}

// Authorizer decides where a deploy may go and which secret references a
// request of a project may name (package authz).
type Authorizer interface {
	// Target refuses (with an error for the log only) a target at a
	// special address (loopback, metadata, this host...; registered or
	// not), or a deploy target that is not a registered server and not in
	// the operator's allow-list.
	Target(ctx context.Context, address string, registered bool) error
	// Ref refuses a reference the project may not use, or one naming a
	// credential of the service itself (own).
	Ref(projectID, field, ref string, own []string) (secrets.Ref, error)
}

// SSHChecker checks that a server answers SSH with our credentials.
type SSHChecker interface {
	Check(ctx context.Context, t sshcheck.Target, signers []ssh.Signer) (*sshcheck.Result, error)
}

// Playbooks names the playbooks of each kind of run (files under the
// ansible directory's playbooks/).
type Playbooks struct {
	Setup    string
	Recovery string
	Nuke     string
	Deploy   string
}

// DefaultPlaybooks are the playbooks of the project's ansible/ directory.
var DefaultPlaybooks = Playbooks{
	Setup:    "setup_server.yml",
	Recovery: "recovery.yml",
	Nuke:     "nuke.yml",
	Deploy:   "deploy_project.yml",
}

// Config holds the handler's settings. New validates it and fills in
// nothing: the service's configuration (package app) holds the defaults.
type Config struct {
	// Owner names this instance in run rows (the stream consumer name).
	Owner string
	// Playbooks to run (DefaultPlaybooks for the project's ansible/).
	Playbooks Playbooks
	// PlaybookDir is the directory of the playbooks (the ansible
	// directory's playbooks/): the extra playbooks a provisioning request
	// names must be files in it. "": requests with extra playbooks are
	// rejected.
	PlaybookDir string
	// DefaultSSHKeyRef is the secret reference of the SSH private key used
	// for servers without their own ssh_key_ref; "" means none.
	DefaultSSHKeyRef string
	// OwnRefs are further references of the service's own credentials
	// (request signing keys) that no request may name; DefaultSSHKeyRef and
	// every server's ssh_key_ref are refused anyway.
	OwnRefs []string
	// DeploySSHUser is the user deploys log in as on servers that are not
	// registered, and the user setup_server.yml creates.
	DeploySSHUser string
	// MaxDeliveries is the stream consumer's delivery limit: on the last
	// delivery, infrastructure errors become a failed result.
	MaxDeliveries int64
	// CancelPoll is how often the cancel keys of the running jobs are
	// checked (all of them in one round trip).
	CancelPoll time.Duration
	// ProgressTTL is how long a job's progress stream is kept after the job.
	ProgressTTL time.Duration
	// ProgressMaxLen is the approximate length kept of a progress stream;
	// 0 means 10,000 entries.
	ProgressMaxLen int64
	// ReinstallOS is the OS template for provider reinstalls when the server
	// has no "os" label.
	ReinstallOS string
	// ReinstallSSHWait is how long to wait for SSH after a reinstall.
	ReinstallSSHWait time.Duration
	// SSHCheckReuse is how long an SSH check that passed (or a play that
	// succeeded) stands: a run to the same address, port and user within
	// it, with the same pinned host key and SSH key, goes without a check
	// of its own. 0 checks before every run. After a failed check, or a
	// play that found the server unreachable, the next run checks.
	SSHCheckReuse time.Duration
	// SSHCheckShared shares the SSH checks that passed with the other
	// replicas through Redis (see passedChecks), so that back-to-back jobs
	// of one server on different replicas reuse them too.
	SSHCheckShared bool
	// ElsewhereRecheck is how long a request whose job runs elsewhere (its
	// job lock is held by another session) stays pending before it is
	// delivered again to see whether that job's outcome is durable by then;
	// 0 means 5s.
	ElsewhereRecheck time.Duration
	// BusyRecheck is how long a request for a server another run holds
	// stays pending, outside the handler slots, before it is delivered
	// again to try the server's lock; 0 means 1s.
	BusyRecheck time.Duration
	// BehindRecheck is how long a request waiting behind others in its
	// servers' lines waits before it looks again (when longer than
	// BusyRecheck): a run that frees the servers hands its slot to the
	// first in line (stream.HandOff), so the look is a fallback. At most
	// a quarter of the stream lease, so that hand-offs can take it.
	BehindRecheck time.Duration
	// OutageWait is how long a job waits out a Postgres outage (retrying
	// with backoff) before the failure counts as an infrastructure error;
	// 0 means 3m.
	OutageWait time.Duration
	// RedisOutageWait is how long publishing a result may wait out Redis
	// being unreachable (the Producer retries for that long); 0: no wait.
	RedisOutageWait time.Duration
	// LockCheck is how often a running job checks that its lock session
	// lives; 0 means the store's default (store.LockOptions).
	LockCheck time.Duration
	// LockLease is how long a running job keeps its locks through a
	// Postgres outage (store.LockOptions.Lease); 0 means the store's
	// default.
	LockLease time.Duration
	// Limits overrides the runner's time limits per playbook name.
	Limits map[string]Limits
	// SiteVars are extra vars of every run (role defaults of the site);
	// a run's own vars win.
	SiteVars map[string]any
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	pb := c.Playbooks
	if pb.Setup == "" || pb.Recovery == "" || pb.Nuke == "" || pb.Deploy == "" {
		errs = append(errs, fmt.Errorf("playbooks %+v: every playbook must be named", pb))
	}
	if c.DeploySSHUser == "" {
		errs = append(errs, errors.New("deploy ssh user not set"))
	}
	if c.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("max deliveries %d: must be at least 1", c.MaxDeliveries))
	}
	if c.ReinstallOS == "" {
		errs = append(errs, errors.New("reinstall os not set"))
	}
	for name, d := range map[string]time.Duration{"cancel poll": c.CancelPoll, "progress ttl": c.ProgressTTL,
		"reinstall ssh wait": c.ReinstallSSHWait} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", name, d))
		}
	}
	for name, d := range map[string]time.Duration{"ssh check reuse": c.SSHCheckReuse, "lock check": c.LockCheck, "lock lease": c.LockLease,
		"elsewhere recheck": c.ElsewhereRecheck, "busy recheck": c.BusyRecheck, "outage wait": c.OutageWait, "redis outage wait": c.RedisOutageWait} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must not be negative", name, d))
		}
	}
	if c.ProgressMaxLen < 0 {
		errs = append(errs, fmt.Errorf("progress max length %d: must not be negative", c.ProgressMaxLen))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("jobs: invalid config: %w", err)
	}
	return nil
}

// Limits are a playbook's wall-clock and idle limits; zero means the
// runner's default.
type Limits struct{ Timeout, Idle time.Duration }

// Deps are the handler's collaborators.
type Deps struct {
	DB       *pgxpool.Pool
	Locker   *store.Locker // run locks; nil: a Locker keeping no idle sessions
	Redis    redis.UniversalClient
	Producer *stream.Producer
	// Secrets resolves the service's own references (SSH keys).
	Secrets *secrets.Resolver
	// Project resolves the references requests carry, with backends of
	// their own (secrets.OpenProject): never the service's own.
	Project  *secrets.Resolver
	Authz    Authorizer
	Redactor *secrets.Redactor
	SSH      SSHChecker
	Runner   Runner
	Provider Provider // nil when no Time4VPS account is configured
	Log      zerolog.Logger
	Metrics  *Metrics
	Clock    clock.Clock // nil: the system clock

	// RunLogs keeps the whole redacted output of every run (pkg/runlog);
	// nil keeps only the result's output tail.
	RunLogs runlog.Store
	// Tracing makes the job's spans (package tracing); nil: none.
	Tracing trace.TracerProvider
}

// Handler handles the entries of provisioner:queue and ansible:deploy:queue.
type Handler struct {
	cfg Config
	Deps
	routes  *stream.Mux        // stream -> handler
	cancels *stream.KeyWatcher // cancel keys of running jobs
	checks  *passedChecks      // SSH checks that passed lately
	// prepared are what waiting Ansible jobs prepared (ServeAnsibleJobs).
	prepared *preparedJobs
}

var _ stream.Handler = (*Handler)(nil)

// New returns a Handler for a valid cfg (see Config.Validate).
func New(cfg Config, deps Deps) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ProgressMaxLen = cmp.Or(cfg.ProgressMaxLen, 10_000)
	if deps.DB == nil || deps.Redis == nil || deps.Producer == nil || deps.Secrets == nil || deps.Project == nil ||
		deps.Authz == nil || deps.Redactor == nil || deps.SSH == nil || deps.Runner == nil {
		return nil, errors.New("jobs: missing dependency")
	}
	if deps.Clock == nil {
		deps.Clock = clock.System()
	}
	if deps.Metrics == nil {
		deps.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if deps.Locker == nil {
		deps.Locker = store.NewLocker(deps.DB, 0)
	}
	h := &Handler{cfg: cfg, Deps: deps, checks: newPassedChecks(cfg.SSHCheckReuse, nil)}
	if cfg.SSHCheckShared {
		h.checks.rdb = deps.Redis
	}
	h.routes = stream.NewMux()
	h.routes.RouteFunc(messages.StreamProvisionerQueue, h.handleProvision)
	h.routes.RouteFunc(messages.StreamAnsibleDeployQueue, h.handleDeploy)
	h.cancels = stream.NewKeyWatcher(deps.Redis, stream.KeyWatcherOptions{Interval: cfg.CancelPoll, Logger: deps.Log})
	return h, nil
}

// fleetActor is infra's name in server_history.
const fleetActor = "infra"

// fleet is the door to server state (pkg/fleet, its one writer), on the
// handler's pool and clock.
func (h *Handler) fleet() *fleet.Store {
	return fleet.New(h.DB, fleet.Options{Now: h.Now})
}

// Now returns the time on the handler's clock.
func (h *Handler) Now() time.Time { return h.Clock.Now() }

// Handle processes one request entry; see the package documentation. An
// entry of any other stream is dead-lettered (stream.ReasonUnknownStream).
func (h *Handler) Handle(ctx context.Context, msg *stream.Message) error {
	return h.routes.Handle(ctx, msg)
}

// Streams returns the streams Handle serves.
func (h *Handler) Streams() []string { return h.routes.Streams() }

// lastDelivery reports whether msg will not be delivered again after a
// failure.
func (h *Handler) lastDelivery(msg *stream.Message) bool {
	return msg.Deliveries >= h.cfg.MaxDeliveries
}
