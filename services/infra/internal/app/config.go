package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/inventory"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/signing"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// Name is the service's name in logs, metrics and --help.
const Name = "infra"

// Summary is the one-line description --help prints.
const Summary = "runs Ansible for provisioning and deploy requests from Redis Streams"

// DefaultAdminAddr is where the admin server listens unless ADMIN_ADDR says otherwise.
const DefaultAdminAddr = "127.0.0.1:9102"

// Config is the configuration of the service, read from the environment by
// service.Load.
type Config struct {
	service.Common
	Stream   StreamConfig   `envPrefix:"STREAM_"`
	Playbook PlaybookConfig `envPrefix:"PLAYBOOK_"`
	SSH      SSHConfig      `envPrefix:"SSH_"`
	Jobs     JobsConfig
	Secrets  secrets.Config
	// Project holds the backends of the secret references requests carry
	// (PROJECT_*), apart from the service's own (Secrets).
	Project secrets.ProjectConfig `envPrefix:"PROJECT_"`
	Authz   authz.Config
	// Sources holds the Ansible jobs' repository cache (SOURCES_*).
	Sources sources.Config `envPrefix:"SOURCES_"`
	// Inventory holds the limits of the Ansible jobs' inventories
	// (INVENTORY_*; INVENTORY_MAX_HOSTS bounds every job).
	Inventory inventory.Config `envPrefix:"INVENTORY_"`
	// Galaxy lists the Galaxy servers Ansible jobs may install from
	// (GALAXY_*).
	Galaxy   sources.GalaxyConfig `envPrefix:"GALAXY_"`
	Signing  signing.Config
	Time4VPS time4vps.Config
	// RunLog is where the whole output of every run is kept (the
	// deployer serves it); the same settings as the deployer's.
	RunLog runlog.Config
}

// StreamConfig configures the consumer of the request streams.
type StreamConfig struct {
	Group         string        `env:"GROUP" envDefault:"infra" desc:"consumer group on provisioner:queue and ansible:deploy:queue"`
	ConsumerName  string        `env:"CONSUMER_NAME" desc:"this instance's name in the group (default: host-pid-random; a stable name re-runs its own pending entries at start)"`
	Concurrency   int           `env:"CONCURRENCY" envDefault:"4" desc:"requests handled at once by this instance"`
	Lease         time.Duration `env:"LEASE" envDefault:"30s" desc:"how long a request may go without a heartbeat before another instance takes it over"`
	MaxDeliveries int64         `env:"MAX_DELIVERIES" envDefault:"5" desc:"deliveries of a request before it fails (infrastructure errors) or is dead-lettered"`
	RetryBackoff  time.Duration `env:"RETRY_BACKOFF" envDefault:"5s" desc:"delay before a request that hit an infrastructure error is retried (doubles each time)"`
}

// PlaybookConfig configures the playbook runs.
type PlaybookConfig struct {
	Dir             string            `env:"DIR" envDefault:"ansible" desc:"the ansible directory (ansible.cfg, playbooks/, roles/, plugins/); relative to the working directory"`
	Bin             string            `env:"BIN" envDefault:"/usr/bin/ansible-playbook" desc:"the ansible-playbook command"`
	RunRoot         string            `env:"RUN_ROOT" envDefault:"/tmp/autoprov-runs" desc:"parent of the private per-run directories (keep it short: it holds unix sockets)"`
	FactCache       string            `env:"FACT_CACHE" desc:"directory of Ansible's fact cache (default: next to PLAYBOOK_RUN_ROOT)"`
	Guard           string            `env:"GUARD" desc:"the runguard binary, which kills a play whose infra process died (default: runguard next to this binary)"`
	Timeout         time.Duration     `env:"TIMEOUT" envDefault:"1h" desc:"wall-clock limit of a playbook run"`
	IdleTimeout     time.Duration     `env:"IDLE_TIMEOUT" envDefault:"10m" desc:"limit of a run printing nothing (stuck)"`
	KillGrace       time.Duration     `env:"KILL_GRACE" envDefault:"10s" desc:"time between SIGTERM and SIGKILL when a run is stopped"`
	Timeouts        map[string]string `env:"TIMEOUTS" desc:"per-playbook limits, e.g. deploy_project.yml:20m/5m,recovery.yml:15m/3m (wall/idle)"`
	User            string            `env:"USER" desc:"unprivileged user the playbooks run as (infra must run as root), e.g. autoprov-play; plays then cannot read infra's files, memory or environment (empty: infra's own user)"`
	Sandbox         string            `env:"SANDBOX" envDefault:"bwrap" desc:"bwrap: every run (provisioning, deploy, Ansible job) runs in a bubblewrap sandbox of its own (docs/security.md); off: no sandbox, only PLAYBOOK_USER (unsafe with Ansible jobs of several projects)"`
	SandboxBwrap    string            `env:"SANDBOX_BWRAP" envDefault:"/usr/bin/bwrap" desc:"the bubblewrap binary (Debian's bubblewrap package)"`
	SandboxUIDs     string            `env:"SANDBOX_UIDS" envDefault:"40000-40999" desc:"user ids of Ansible job runs in the sandbox, one per concurrent run on this machine (infra as root); no account may use one"`
	SandboxWritable []string          `env:"SANDBOX_WRITABLE" envSeparator:"," desc:"directories of this machine the fleet's own runs (provisioning, deploys; never jobs) may write to in the sandbox"`
	VarsFile        string            `env:"VARS_FILE" desc:"JSON object of site-wide extra vars for every run (role defaults, e.g. docker_install_source); never secrets; a run's own vars win"`
	// TakeoverAlways turns the clean marks off (see ansible.CleanScopes).
	TakeoverAlways bool `env:"TAKEOVER_ALWAYS" envDefault:"false" desc:"take over the target (stop earlier runs' remote tasks over SSH) before every play, even when its last run succeeded; set it while replicas of a version older than the clean marks still run"`
}

// SSHConfig configures the SSH check before every run.
type SSHConfig struct {
	KeyRef           string          `env:"KEY_REF" desc:"secret reference of the SSH private key for servers without ssh_key_ref (e.g. vault:secret/infra/ssh#private_key)"`
	Attempts         int             `env:"ATTEMPTS" envDefault:"3" desc:"connection attempts before a server counts as unreachable"`
	BaseDelay        time.Duration   `env:"BASE_DELAY" envDefault:"2s" desc:"delay before the second attempt; it grows by SSH_DELAY_FACTOR, with jitter"`
	MaxDelay         time.Duration   `env:"MAX_DELAY" envDefault:"30s" desc:"longest delay between attempts"`
	DelayFactor      float64         `env:"DELAY_FACTOR" envDefault:"2" desc:"each further delay is this many times the one before (at least 1)"`
	DelayJitter      float64         `env:"DELAY_JITTER" envDefault:"0.2" desc:"spread of each delay (0.2: ±20%; 0: none; below 1)"`
	AttemptTimeout   time.Duration   `env:"ATTEMPT_TIMEOUT" envDefault:"15s" desc:"timeout of one attempt (TCP connect and SSH handshake)"`
	HostKeyPolicy    sshcheck.Policy `env:"HOST_KEY_POLICY" envDefault:"tofu" desc:"tofu (pin the first host key, enforce it after), strict (require a pinned key) or off (insecure)"`
	DeployUser       string          `env:"DEPLOY_USER" envDefault:"deploy" desc:"user setup_server.yml creates and later runs log in as; deploys to unregistered servers use it too"`
	CheckReuse       time.Duration   `env:"CHECK_REUSE" envDefault:"5s" desc:"a run goes without an SSH check when the same address, port and user passed one (or ran a play that succeeded) this recently with the same host key and SSH key; never after a failed check or an unreachable play; 0 checks before every run"`
	WarmConnections  bool            `env:"WARM_CONNECTIONS" envDefault:"false" desc:"keep one SSH connection (an ssh master started by infra) per server, login user, pinned host key and SSH key open between provisioning and deploy runs, so that back-to-back runs skip the handshake; never for Ansible jobs; while a master lives, any process of the play user can use it (docs/infra.md, Warm SSH connections)"`
	WarmIdle         time.Duration   `env:"WARM_IDLE" envDefault:"60s" desc:"how long a warm SSH connection (SSH_WARM_CONNECTIONS) stays open without a run"`
	CheckReuseShared bool            `env:"CHECK_REUSE_SHARED" envDefault:"true" desc:"share the passed SSH checks of SSH_CHECK_REUSE with the other replicas through Redis (a hashed key per address, port and user holding when it passed and a hash of the host key and SSH key), so that back-to-back jobs of one server on different replicas reuse them; a failure on any replica makes all check again"`
}

// JobsConfig configures the handling of requests.
type JobsConfig struct {
	ReinstallOS      string        `env:"REINSTALL_OS" envDefault:"kvm-debian-12-x86_64" desc:"Time4VPS OS template for reinstalls of servers without an os label"`
	ReinstallSSHWait time.Duration `env:"REINSTALL_SSH_WAIT" envDefault:"15m" desc:"how long to wait for SSH after a provider reinstall"`
	ProgressTTL      time.Duration `env:"PROGRESS_TTL" envDefault:"24h" desc:"how long a job's progress stream is kept after the job"`
	CancelPoll       time.Duration `env:"CANCEL_POLL" envDefault:"1s" desc:"how often a running job checks its cancel key"`
	BusyRecheck      time.Duration `env:"SERVER_BUSY_RECHECK" envDefault:"1s" desc:"how often a request for a server another run holds tries the server again; it waits pending in the stream, not in one of the CONCURRENCY slots"`
	OutageWait       time.Duration `env:"DB_OUTAGE_WAIT" envDefault:"3m" desc:"how long a job waits out a Postgres outage (retrying with backoff) before it counts as an infrastructure error; a job never fails for an outage shorter than this"`
	LockLease        time.Duration `env:"RUN_LOCK_LEASE" envDefault:"60s" desc:"how long a running play keeps its servers' locks through a Postgres outage (a restart ends the lock sessions): nobody else takes them meanwhile, and the play goes on when Postgres is back; a longer outage stops it"`
	RedisOutageWait  time.Duration `env:"REDIS_OUTAGE_WAIT" envDefault:"3m" desc:"how long publishing a job's result waits out Redis being unreachable (a restart, a failover) before the request is retried; the play itself goes on through a Redis outage"`
	Pools            []string      `env:"JOB_POOLS" envDefault:"default" envSeparator:"," desc:"pools of Ansible jobs this instance serves: default (ansible:job:queue) and/or names of ansible:job:queue:<pool>; none: no Ansible jobs"`
	WorkDir          string        `env:"JOB_WORK_DIR" desc:"parent of the Ansible jobs' private directories (checkouts, generated plays); default: autoprov-jobs next to PLAYBOOK_RUN_ROOT"`
	Prepared         int           `env:"JOB_PREPARED_MAX" envDefault:"32" desc:"how many Ansible jobs waiting for busy hosts keep what they prepared (checkout, inventory, requirements) on this instance for their next look; the oldest is dropped first"`
	PreparedTTL      time.Duration `env:"JOB_PREPARED_TTL" envDefault:"15m" desc:"how long a waiting job's preparation is kept for its next look before it is dropped (it prepares again then)"`
}

// stopMargin is the part of SHUTDOWN_GRACE kept for what follows the
// cancelled handlers: releasing their entries, flushing acks, closing.
const stopMargin = 2 * time.Second

// CancelGrace is how long requests cancelled at shutdown have to return:
// their plays get SIGTERM, SIGKILL after PLAYBOOK_KILL_GRACE, then the run
// locks are released.
func (c *Config) CancelGrace() time.Duration { return c.Playbook.KillGrace + 3*time.Second }

// DrainGrace is how long requests in flight may go on after SIGTERM before
// they are cancelled and their entries released to other instances. It is
// what is left of SHUTDOWN_GRACE after CancelGrace and a margin, so the
// consumer always reaches "cancel and release" before the service gives
// up (exiting with the entries still held and their lock waits queued).
// Short is reports that SHUTDOWN_GRACE leaves less than a second for it.
func (c *Config) DrainGrace() (d time.Duration, short bool) {
	d = c.ShutdownGrace - c.CancelGrace() - stopMargin
	return max(d, 100*time.Millisecond), d < time.Second
}

// NewConfig returns a Config holding the service's own defaults, ready for
// service.Load and service.Usage.
func NewConfig() *Config {
	return &Config{Common: service.Common{AdminAddr: DefaultAdminAddr}}
}

// Validate checks the infra settings (Load checks Common itself).
func (c *Config) Validate() error {
	var errs []error
	if c.Stream.Group == "" {
		errs = append(errs, service.Invalid("STREAM_GROUP", "required"))
	}
	if c.Stream.Concurrency < 1 {
		errs = append(errs, service.Invalid("STREAM_CONCURRENCY", "must be at least 1, got %d", c.Stream.Concurrency))
	}
	if c.Stream.Lease < time.Second {
		errs = append(errs, service.Invalid("STREAM_LEASE", "must be at least 1s, got %s", c.Stream.Lease))
	}
	if c.Stream.MaxDeliveries < 1 {
		errs = append(errs, service.Invalid("STREAM_MAX_DELIVERIES", "must be at least 1"))
	}
	if c.Playbook.Timeout <= 0 || c.Playbook.IdleTimeout <= 0 || c.Playbook.KillGrace <= 0 {
		errs = append(errs, service.Invalid("PLAYBOOK_TIMEOUT", "PLAYBOOK_TIMEOUT, PLAYBOOK_IDLE_TIMEOUT and PLAYBOOK_KILL_GRACE must be positive"))
	}
	if !filepath.IsAbs(c.Playbook.RunRoot) {
		errs = append(errs, service.Invalid("PLAYBOOK_RUN_ROOT", "must be an absolute path"))
	}
	if _, err := c.Playbook.SiteVars(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Playbook.RunAs(); err != nil {
		errs = append(errs, err)
	} else if err := c.Playbook.checkPlayUserReads(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Playbook.SandboxConfig(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Playbook.Limits(); err != nil {
		errs = append(errs, &service.FieldError{Var: "PLAYBOOK_TIMEOUTS", Err: err})
	}
	if c.SSH.Attempts < 1 {
		errs = append(errs, service.Invalid("SSH_ATTEMPTS", "must be at least 1"))
	}
	if c.SSH.BaseDelay < 0 {
		errs = append(errs, service.Invalid("SSH_BASE_DELAY", "must not be negative"))
	}
	if c.SSH.MaxDelay < c.SSH.BaseDelay {
		errs = append(errs, service.Invalid("SSH_MAX_DELAY", "must be at least SSH_BASE_DELAY (%s)", c.SSH.BaseDelay))
	}
	if !(c.SSH.DelayFactor >= 1) || math.IsInf(c.SSH.DelayFactor, 0) {
		errs = append(errs, service.Invalid("SSH_DELAY_FACTOR", "must be a number of at least 1"))
	}
	if !(c.SSH.DelayJitter >= 0 && c.SSH.DelayJitter < 1) {
		errs = append(errs, service.Invalid("SSH_DELAY_JITTER", "must be at least 0 and below 1"))
	}
	if c.SSH.AttemptTimeout <= 0 {
		errs = append(errs, service.Invalid("SSH_ATTEMPT_TIMEOUT", "must be positive"))
	}
	if c.SSH.WarmConnections && c.SSH.WarmIdle <= 0 {
		errs = append(errs, service.Invalid("SSH_WARM_IDLE", "must be positive with SSH_WARM_CONNECTIONS"))
	}
	if c.SSH.CheckReuse < 0 {
		errs = append(errs, service.Invalid("SSH_CHECK_REUSE", "must not be negative"))
	}
	switch c.SSH.HostKeyPolicy {
	case sshcheck.PolicyTOFU, sshcheck.PolicyStrict, sshcheck.PolicyOff:
	default:
		errs = append(errs, service.Invalid("SSH_HOST_KEY_POLICY", "must be tofu, strict or off"))
	}
	if err := c.Secrets.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(c.Project.Validate(), c.Project.Separate(c.Secrets)); err != nil {
		errs = append(errs, err)
	}
	if err := c.Authz.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Signing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// WarmIdleOrOff is the runner's ansible.Config.WarmIdle: 0 unless
// SSH_WARM_CONNECTIONS.
func (s SSHConfig) WarmIdleOrOff() time.Duration {
	if !s.WarmConnections {
		return 0
	}
	return s.WarmIdle
}

// RunAs resolves PLAYBOOK_USER (nil when unset).
func (p PlaybookConfig) RunAs() (*ansible.Credential, error) {
	if p.User == "" {
		return nil, nil
	}
	u, err := user.Lookup(p.User)
	if err != nil {
		return nil, &service.FieldError{Var: "PLAYBOOK_USER", Err: err}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, &service.FieldError{Var: "PLAYBOOK_USER", Err: err}
	}
	if uid == 0 {
		return nil, service.Invalid("PLAYBOOK_USER", "%s is root: name an unprivileged user", p.User)
	}
	return &ansible.Credential{UID: uint32(uid), GID: uint32(gid)}, nil
}

// SandboxConfig is the runner's Sandbox (nil with PLAYBOOK_SANDBOX=off).
// Without root, runs keep infra's user: the uid range is not used.
func (p PlaybookConfig) SandboxConfig() (*ansible.Sandbox, error) {
	switch p.Sandbox {
	case "off":
		return nil, nil
	case "bwrap":
	default:
		return nil, service.Invalid("PLAYBOOK_SANDBOX", "must be bwrap or off, got %q", p.Sandbox)
	}
	sb := &ansible.Sandbox{Bwrap: p.SandboxBwrap, Writable: p.SandboxWritable}
	if os.Geteuid() == 0 {
		uids, err := ansible.ParseUIDRange(p.SandboxUIDs)
		if err != nil {
			return nil, &service.FieldError{Var: "PLAYBOOK_SANDBOX_UIDS", Err: err}
		}
		sb.UIDs = uids
	}
	return sb, nil
}

// SiteVars reads PLAYBOOK_VARS_FILE (nil when unset).
func (p PlaybookConfig) SiteVars() (map[string]any, error) {
	if p.VarsFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(p.VarsFile)
	if err != nil {
		return nil, &service.FieldError{Var: "PLAYBOOK_VARS_FILE", Err: err}
	}
	var vars map[string]any
	if err := json.Unmarshal(data, &vars); err != nil {
		return nil, &service.FieldError{Var: "PLAYBOOK_VARS_FILE", Err: fmt.Errorf("not a JSON object: %w", err)}
	}
	return vars, nil
}

// Limits parses PLAYBOOK_TIMEOUTS: playbook name to "wall/idle" (either may
// be empty for the default).
func (p PlaybookConfig) Limits() (map[string]jobs.Limits, error) {
	out := make(map[string]jobs.Limits, len(p.Timeouts))
	for name, v := range p.Timeouts {
		wall, idle, _ := strings.Cut(v, "/")
		var l jobs.Limits
		var err error
		if wall != "" {
			if l.Timeout, err = time.ParseDuration(wall); err != nil || l.Timeout <= 0 {
				return nil, fmt.Errorf("%s: wall-clock limit %q is not a positive duration", name, wall)
			}
		}
		if idle != "" {
			if l.Idle, err = time.ParseDuration(idle); err != nil || l.Idle <= 0 {
				return nil, fmt.Errorf("%s: idle limit %q is not a positive duration", name, idle)
			}
		}
		out[name] = l
	}
	return out, nil
}
