package app

import (
	"errors"
	"path/filepath"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/reqsign"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

// Name is the service's name in logs, metrics and --help.
const Name = "scheduler"

// Summary is the one-line description --help prints.
const Summary = "keeps the fleet in Postgres in sync with its sources and queues provisioning"

// DefaultAdminAddr is where the admin server listens unless ADMIN_ADDR says otherwise.
const DefaultAdminAddr = "127.0.0.1:9101"

// DefaultMemoryLimit is the Go runtime's soft memory limit unless
// GOMEMLIMIT says otherwise. A tick keeps about 150 bytes a server between
// ticks (the fleet's snapshot and the addresses claimed, ~145 MB at a
// million) and makes short-lived garbage as sources list: the limit makes
// the collector return that garbage instead of letting the heap double,
// and must stay well above what the tick keeps, or the collector runs
// without pause (see docs/performance.md).
const DefaultMemoryLimit = 256 << 20

// Config is the configuration of the service, read from the environment by
// service.Load.
type Config struct {
	service.Common
	Tick   TickConfig   `envPrefix:"TICK_"`
	Retry  RetryConfig  `envPrefix:"RETRY_"`
	Health HealthConfig `envPrefix:"HEALTH_"`
	// Schedules configures the job template schedules' loop.
	Schedules SchedulesConfig `envPrefix:"SCHEDULES_"`
	Sources   SourcesConfig
	// Special lets sources list servers at special addresses (test
	// targets on loopback); the same variable as infra's.
	Special authz.SpecialConfig
	EC2     EC2Config `envPrefix:"EC2_"`
	Notify  NotifyConfig
	Results ResultsConfig `envPrefix:"RESULTS_"`
	Rules   RulesConfig
	Secrets secrets.Config
	// Project resolves the projects' credentials their notification
	// rules name (PROJECT_VAULT_*, a Vault login of its own whose
	// policy covers project paths only), as infra's does.
	Project  secrets.ProjectConfig `envPrefix:"PROJECT_"`
	Time4VPS time4vps.Config
	// Signing signs the requests the scheduler publishes (infra checks
	// them against REQUEST_KEYS).
	Signing reqsign.Config
}

// TickConfig configures the reconcile loop.
type TickConfig struct {
	Interval       time.Duration `env:"INTERVAL" envDefault:"30s" desc:"time between two reconcile ticks (sources synced, jobs queued)"`
	Batch          int           `env:"BATCH" envDefault:"500" desc:"most jobs queued per tick"`
	StuckAfter     time.Duration `env:"STUCK_AFTER" envDefault:"2h" desc:"a job without result that infra is not running is handed over again after this (keep above infra's PLAYBOOK_TIMEOUT)"`
	LeaderElection bool          `env:"LEADER_ELECTION" envDefault:"true" desc:"only the replica holding a Postgres advisory lock ticks and probes (safety does not depend on it)"`
	RelayBatch     int           `env:"RELAY_BATCH" envDefault:"500" desc:"outbox entries published to Redis per round trip"`
}

// RetryConfig configures retries of failed servers.
type RetryConfig struct {
	Limit               int           `env:"LIMIT" envDefault:"3" desc:"failed attempts a server may have before it stays FAILED (rules may override per server)"`
	Backoff             time.Duration `env:"BACKOFF" envDefault:"1m" desc:"wait before the first retry; it doubles with each failure"`
	MaxBackoff          time.Duration `env:"MAX_BACKOFF" envDefault:"1h" desc:"longest wait between retries"`
	UnreachableCooldown time.Duration `env:"UNREACHABLE_COOLDOWN" envDefault:"10m" desc:"wait before an UNREACHABLE server is checked again"`
}

// HealthConfig configures the health checks of READY servers.
type HealthConfig struct {
	Enabled          bool          `env:"ENABLED" envDefault:"true" desc:"probe READY servers (TCP to the SSH port, plus the rules' health URL)"`
	Interval         time.Duration `env:"INTERVAL" envDefault:"1m" desc:"how often each READY server is probed (probes are spread over it)"`
	Concurrency      int           `env:"CONCURRENCY" envDefault:"64" desc:"probes in flight at most"`
	Timeout          time.Duration `env:"TIMEOUT" envDefault:"5s" desc:"timeout of one probe"`
	Failures         int           `env:"FAILURES" envDefault:"3" desc:"consecutive failed probes that flag a recovery"`
	RecoveryCooldown time.Duration `env:"RECOVERY_COOLDOWN" envDefault:"30m" desc:"least time between two recoveries of one server"`
}

// SchedulesConfig configures the loop that turns due job template
// schedules into occurrences for the deployer to launch.
type SchedulesConfig struct {
	Enabled  bool          `env:"ENABLED" envDefault:"true" desc:"run the job template schedules (the leader writes their occurrences; the deployer launches them)"`
	Interval time.Duration `env:"INTERVAL" envDefault:"1s" desc:"time between two rounds of the schedules loop"`
	Batch    int           `env:"BATCH" envDefault:"500" desc:"schedules moved on per transaction"`
}

// SourcesConfig configures the detectors. Precedence (first wins on a
// duplicate): the inventories in order, then Time4VPS, then EC2.
type SourcesConfig struct {
	Inventories       []string      `env:"INVENTORY_FILES" envSeparator:"," desc:"comma-separated Ansible inventories (files or directories, any format ansible-inventory reads)"`
	InventoryBin      string        `env:"ANSIBLE_INVENTORY_BIN" envDefault:"ansible-inventory" desc:"the ansible-inventory command"`
	Time4VPS          bool          `env:"TIME4VPS_DETECT" envDefault:"true" desc:"list the Time4VPS account's servers (when TIME4VPS_USERNAME is set)"`
	Timeout           time.Duration `env:"SOURCE_TIMEOUT" envDefault:"2m" desc:"longest a source may take to list its servers (then it counts as failing)"`
	MaxOrphanFraction float64       `env:"MAX_ORPHAN_FRACTION" envDefault:"0.5" desc:"a source that would orphan more than this share of its servers at once, or all of them, counts as failing (1 = no guard; see Merge rules)"`
}

// EC2Config configures the EC2 detector; it is on when EC2_REGION is set.
type EC2Config struct {
	Region       string `env:"REGION" desc:"AWS region of the EC2 detector (empty disables it)"`
	Endpoint     string `env:"ENDPOINT" desc:"EC2 endpoint URL (default: AWS's for the region)"`
	Tags         string `env:"TAGS" desc:"instances to list by tag: key=v1|v2,key2=*,key3 (running instances only)"`
	Address      string `env:"ADDRESS" envDefault:"public" desc:"address servers are reached at: public or private"`
	SSHUser      string `env:"SSH_USER" envDefault:"admin" desc:"SSH user of EC2 servers (the autoprov:ssh_user tag overrides it)"`
	AccessKeyID  string `env:"ACCESS_KEY_ID" desc:"AWS access key id (empty: the SDK's default credential chain)"`
	SecretKeyRef string `env:"SECRET_ACCESS_KEY_REF" desc:"secret reference of the AWS secret access key (env:, file: or vault:)"`
	PageSize     int32  `env:"PAGE_SIZE" envDefault:"1000" desc:"DescribeInstances MaxResults (5-1000)"`
}

// NotifyConfig configures the notification channels.
type NotifyConfig struct {
	SlackWebhookRef  string        `env:"SLACK_WEBHOOK_URL_REF" desc:"secret reference of the Slack incoming webhook URL (empty disables Slack)"`
	TelegramTokenRef string        `env:"TELEGRAM_BOT_TOKEN_REF" desc:"secret reference of the Telegram bot token (empty disables Telegram)"`
	TelegramChat     string        `env:"TELEGRAM_CHAT_ID" desc:"Telegram chat id or @channel the bot writes to"`
	TelegramAPI      string        `env:"TELEGRAM_API_URL" envDefault:"https://api.telegram.org" desc:"Telegram Bot API base URL"`
	DigestThreshold  int           `env:"NOTIFY_DIGEST_THRESHOLD" envDefault:"5" desc:"this many pending notifications or more go out as one digest"`
	Timeout          time.Duration `env:"NOTIFY_TIMEOUT" envDefault:"15s" desc:"timeout of one notification request"`
}

// ResultsConfig configures the consumer of provisioner:results.
type ResultsConfig struct {
	ConsumerName string `env:"CONSUMER_NAME" desc:"this instance's name in group scheduler (default: host-pid-random)"`
	Concurrency  int    `env:"CONCURRENCY" envDefault:"8" desc:"results applied at once"`
}

// RulesConfig configures the rules file.
type RulesConfig struct {
	File        string `env:"RULES_FILE" desc:"YAML rules file mapping servers to extra playbooks and settings (reloaded on SIGHUP or change)"`
	PlaybookDir string `env:"PLAYBOOK_DIR" envDefault:"ansible" desc:"the ansible directory; playbooks named by rules must exist in its playbooks/"`
}

// NewConfig returns a Config holding the service's own defaults, ready for
// service.Load and service.Usage.
func NewConfig() *Config {
	return &Config{Common: service.Common{AdminAddr: DefaultAdminAddr}}
}

// Validate checks the scheduler's settings (Load checks Common itself).
func (c *Config) Validate() error {
	var errs []error
	if err := c.Signing.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Special.Validate(); err != nil {
		errs = append(errs, err)
	}
	positive := map[string]time.Duration{
		"TICK_INTERVAL": c.Tick.Interval, "TICK_STUCK_AFTER": c.Tick.StuckAfter, "RETRY_BACKOFF": c.Retry.Backoff,
		"RETRY_MAX_BACKOFF": c.Retry.MaxBackoff, "RETRY_UNREACHABLE_COOLDOWN": c.Retry.UnreachableCooldown,
		"HEALTH_INTERVAL": c.Health.Interval, "HEALTH_TIMEOUT": c.Health.Timeout, "HEALTH_RECOVERY_COOLDOWN": c.Health.RecoveryCooldown,
		"SOURCE_TIMEOUT": c.Sources.Timeout, "NOTIFY_TIMEOUT": c.Notify.Timeout,
	}
	for name, d := range positive {
		if d <= 0 {
			errs = append(errs, service.Invalid(name, "must be a positive duration, got %s", d))
		}
	}
	for name, n := range map[string]int{"TICK_BATCH": c.Tick.Batch, "TICK_RELAY_BATCH": c.Tick.RelayBatch, "RETRY_LIMIT": c.Retry.Limit,
		"HEALTH_CONCURRENCY": c.Health.Concurrency, "HEALTH_FAILURES": c.Health.Failures,
		"RESULTS_CONCURRENCY": c.Results.Concurrency, "NOTIFY_DIGEST_THRESHOLD": c.Notify.DigestThreshold} {
		if n < 1 {
			errs = append(errs, service.Invalid(name, "must be at least 1, got %d", n))
		}
	}
	if f := c.Sources.MaxOrphanFraction; f <= 0 || f > 1 {
		errs = append(errs, service.Invalid("MAX_ORPHAN_FRACTION", "must be in (0, 1], got %g", f))
	}
	if c.EC2.Region != "" {
		if c.EC2.Address != "public" && c.EC2.Address != "private" {
			errs = append(errs, service.Invalid("EC2_ADDRESS", "must be public or private"))
		}
		if _, err := ec2.ParseTags(c.EC2.Tags); err != nil {
			errs = append(errs, service.Invalid("EC2_TAGS", "%v", err))
		}
		if (c.EC2.AccessKeyID == "") != (c.EC2.SecretKeyRef == "") {
			errs = append(errs, service.Invalid("EC2_ACCESS_KEY_ID", "EC2_ACCESS_KEY_ID and EC2_SECRET_ACCESS_KEY_REF go together"))
		}
	}
	if (c.Notify.TelegramTokenRef == "") != (c.Notify.TelegramChat == "") {
		errs = append(errs, service.Invalid("TELEGRAM_CHAT_ID", "TELEGRAM_BOT_TOKEN_REF and TELEGRAM_CHAT_ID go together"))
	}
	for name, ref := range map[string]string{"SLACK_WEBHOOK_URL_REF": c.Notify.SlackWebhookRef,
		"TELEGRAM_BOT_TOKEN_REF": c.Notify.TelegramTokenRef, "EC2_SECRET_ACCESS_KEY_REF": c.EC2.SecretKeyRef} {
		if ref == "" {
			continue
		}
		if _, err := secrets.ParseRef(ref); err != nil {
			errs = append(errs, service.Invalid(name, "%v", err))
		}
	}
	if err := c.Secrets.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.Rules.check()...)
	return errors.Join(errs...)
}

// check loads the rules file, so that --check-config (and autoprov
// validate) finds what the scheduler would refuse at start: one problem per
// mistake, each naming the file and line.
func (r RulesConfig) check() []error {
	if r.File == "" {
		return nil
	}
	_, err := rules.Load(r.File, filepath.Join(r.PlaybookDir, "playbooks"))
	var rerr *rules.Error
	switch {
	case errors.As(err, &rerr):
		out := make([]error, len(rerr.Problems))
		for i, p := range rerr.Problems {
			out[i] = service.Invalid("RULES_FILE", "%s", p.String())
		}
		return out
	case err != nil:
		return []error{service.Invalid("RULES_FILE", "%v", err)}
	}
	return nil
}
