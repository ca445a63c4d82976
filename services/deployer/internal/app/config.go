package app

import (
	"crypto/tls"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/reqsign"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// Name is the service's name in logs, metrics and --help.
const Name = "deployer"

// Summary is the one-line description --help prints.
const Summary = "HTTP front door for deployments"

// DefaultAdminAddr is where the admin server listens unless ADMIN_ADDR says otherwise.
const DefaultAdminAddr = "127.0.0.1:9103"

// DefaultAPIAddr is where the API listens unless API_ADDR says otherwise.
const DefaultAPIAddr = "127.0.0.1:8080"

// Config is the configuration of the service, read from the environment by
// service.Load.
type Config struct {
	service.Common

	API      APIConfig
	Console  ConsoleConfig // the web console (/ui/): console.go
	Stream   StreamConfig
	Webhooks WebhookConfig
	RunLog   runlog.Config
	Keep     RetentionConfig
	// Signing signs the requests the deployer publishes (infra checks
	// them against REQUEST_KEYS).
	Signing reqsign.Config
	// SecretRefs are the templates of the secret references a request
	// may name, checked at submit.
	SecretRefs SecretRefsConfig
	// Pools grants the Ansible job pools to projects, as infra's
	// JOB_POOL_PROJECTS (give both the same value); checked at submit.
	Pools authz.PoolConfig
	// Special lets special addresses through as infra's
	// SPECIAL_ALLOW_NETWORKS (give both the same value): the hosts of an
	// inline inventory at other special addresses are refused at submit.
	Special authz.SpecialConfig
	// Credentials configures the named credentials' Vault writer.
	Credentials CredentialsConfig `envPrefix:"CREDENTIALS_"`
	// ScheduleLaunchWorkers launch the occurrences of job template
	// schedules that the scheduler writes.
	ScheduleLaunchWorkers int `env:"SCHEDULE_LAUNCH_WORKERS" envDefault:"8" desc:"launches of job template schedule occurrences in flight at most (the scheduler writes the occurrences; 0 leaves them to other replicas)"`
	// ScheduleLaunchLease is how long a launcher's claim on occurrences
	// lasts.
	ScheduleLaunchLease time.Duration `env:"SCHEDULE_LAUNCH_LEASE" envDefault:"1m" desc:"how long a launcher's claim on schedule occurrences lasts: those of a deployer that died are launched after it, into the jobs it made"`
	// WorkflowPoll is how often the workflow engine looks at active runs
	// without a change made through this replica.
	WorkflowPoll time.Duration `env:"WORKFLOW_POLL" envDefault:"1s" desc:"how often the workflow engine advances active workflow runs (jobs that ended, approvals that timed out)"`
}

// CredentialsConfig configures where POST /api/v1/credentials writes the
// values it is given: Vault KV, under the project's path, with a Vault
// login of the deployer's own (CREDENTIALS_VAULT_*), whose policy may
// write those paths only. Without CREDENTIALS_VAULT_ADDR values are
// refused and credentials name references only.
type CredentialsConfig struct {
	Vault secrets.VaultConfig
	Mount string `env:"VAULT_MOUNT" envDefault:"secret" desc:"KV v2 mount credential values are written to"`
	Path  string `env:"VAULT_PATH" envDefault:"projects/{project_id}/credentials/{name}" desc:"path under the mount a credential's value is written to; {project_id} and {name} are replaced (keep it inside DEPLOY_SECRET_REFS's templates, so that infra may read it)"`
	// LaunchPath is where a template survey's secret answers are written.
	LaunchPath string `env:"VAULT_LAUNCH_PATH" envDefault:"projects/{project_id}/launches/{launch}/{variable}" desc:"path under the mount a job template survey's secret answer is written to at launch; {project_id}, {launch} (an id per launch) and {variable} are replaced (keep it inside DEPLOY_SECRET_REFS's templates)"`
}

// SecretRefsConfig is infra's DEPLOY_SECRET_REFS, read by the deployer too:
// a request naming a reference outside its project's templates is refused
// at submit (422) instead of on infra's side, after it was queued. Give
// both services the same value; infra keeps its own check.
type SecretRefsConfig struct {
	Templates []string `env:"DEPLOY_SECRET_REFS" envSeparator:"," envDefault:"vault:secret/projects/{project_id}/**" desc:"templates of the secret references a deployment may name, as infra's DEPLOY_SECRET_REFS (same syntax and default: give both the same value); checked at submit"`
}

// Authorizer returns the checker of the templates.
func (c SecretRefsConfig) Authorizer() (*authz.Authorizer, error) {
	a, err := authz.New(authz.Config{SecretRefs: c.Templates}, authz.Options{})
	if err != nil {
		return nil, service.Invalid("DEPLOY_SECRET_REFS", "%v", err)
	}
	return a, nil
}

// RetentionConfig says how long the deployer keeps what it stores about
// deployments (run logs: RUNLOG_RETENTION).
type RetentionConfig struct {
	Deployments     time.Duration `env:"DEPLOYMENT_RETENTION" envDefault:"2160h" desc:"how long finished deployments are kept, with their webhook deliveries (0 keeps them forever; queued ones are always kept)"`
	IdempotencyKeys time.Duration `env:"IDEMPOTENCY_KEY_TTL" envDefault:"24h" desc:"how long an Idempotency-Key is remembered: a retry after it makes a new deployment (0: as long as its deployment is kept)"`
}

// APIConfig configures the HTTP API.
type APIConfig struct {
	Addr            string        `env:"API_ADDR" envDefault:"127.0.0.1:8080" desc:"host:port of the HTTP API (/api/v1)"`
	MaxBody         int64         `env:"API_MAX_BODY" envDefault:"65536" desc:"largest request body accepted, in bytes"`
	MaxWait         time.Duration `env:"API_MAX_WAIT" envDefault:"10m" desc:"longest ?wait= a request may ask for"`
	RateLimit       int           `env:"API_RATE_LIMIT" envDefault:"50" desc:"requests per second per API key (shared by every replica, through Redis); a key's own limit wins"`
	RateBurst       int           `env:"API_RATE_BURST" envDefault:"100" desc:"requests a key's full budget holds (its burst; RateLimit-Limit); keys with their own rate get twice it"`
	AuthFailureRate int           `env:"API_AUTH_FAILURE_RATE" envDefault:"10" desc:"failed authentications per second allowed per client address"`
	KeyCacheTTL     time.Duration `env:"API_KEY_CACHE_TTL" envDefault:"5s" desc:"how long a checked API key is cached (a revocation reaches other replicas within it; 0 disables)"`
	SSEHeartbeat    time.Duration `env:"API_SSE_HEARTBEAT" envDefault:"15s" desc:"interval of keep-alive comments on quiet event streams"`
	SSERetry        time.Duration `env:"API_SSE_RETRY" envDefault:"3s" desc:"reconnection delay advised to event stream clients"`
	// TLSCertFile and TLSKeyFile, set together, make the API serve HTTPS
	// itself; else it speaks plain HTTP and must sit behind a TLS proxy.
	TLSCertFile string `env:"API_TLS_CERT_FILE" desc:"PEM certificate (chain) the API serves HTTPS with, read at start; with API_TLS_KEY_FILE (both or neither; neither: plain HTTP, put the API behind TLS)"`
	TLSKeyFile  string `env:"API_TLS_KEY_FILE" desc:"PEM private key of API_TLS_CERT_FILE"`
}

// TLS returns the API's TLS configuration: nil when API_TLS_CERT_FILE and
// API_TLS_KEY_FILE are unset (plain HTTP), else one serving their
// certificate, TLS 1.2 at least. Errors name the variables, never the key.
func (c *APIConfig) TLS() (*tls.Config, error) {
	switch {
	case c.TLSCertFile == "" && c.TLSKeyFile == "":
		return nil, nil
	case c.TLSCertFile == "":
		return nil, service.Invalid("API_TLS_CERT_FILE", "required with API_TLS_KEY_FILE (set both or neither)")
	case c.TLSKeyFile == "":
		return nil, service.Invalid("API_TLS_KEY_FILE", "required with API_TLS_CERT_FILE (set both or neither)")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, service.Invalid("API_TLS_CERT_FILE", "load the certificate and API_TLS_KEY_FILE: %v", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// StreamConfig configures the consumers of deploy:results and of the
// request queue.
type StreamConfig struct {
	Group        string        `env:"STREAM_GROUP" envDefault:"deployer" desc:"consumer group on deploy:results (and, observing, on ansible:deploy:queue)"`
	ConsumerName string        `env:"STREAM_CONSUMER_NAME" desc:"this instance's name in the group (default: host-pid-random)"`
	Concurrency  int           `env:"STREAM_CONCURRENCY" envDefault:"16" desc:"results recorded at once by this instance"`
	ObserveQueue bool          `env:"OBSERVE_QUEUE" envDefault:"true" desc:"show requests other producers put on ansible:deploy:queue as deployments while they are queued (else only once their result arrives)"`
	CancelTTL    time.Duration `env:"CANCEL_TTL" envDefault:"24h" desc:"expiry of the cancel key set for a running deployment"`
	Republish    time.Duration `env:"REPUBLISH_AFTER" envDefault:"1m" desc:"a stored deployment not yet published after this long (Redis was down) is published again"`
}

// WebhookConfig configures webhook delivery.
type WebhookConfig struct {
	SigningKey     secrets.Value `env:"WEBHOOK_SIGNING_KEY,unset" secret:"true" desc:"key from which each API key's webhook secret is derived (empty disables webhooks; removed from the environment once read)"`
	SigningKeyFile string        `env:"WEBHOOK_SIGNING_KEY_FILE" desc:"file holding the webhook signing key"`
	AllowCIDRs     []string      `env:"WEBHOOK_ALLOW_CIDRS" desc:"comma-separated addresses or CIDR prefixes webhooks may reach although private, loopback or link-local"`
	Timeout        time.Duration `env:"WEBHOOK_TIMEOUT" envDefault:"10s" desc:"timeout of one webhook request"`
	RetryFor       time.Duration `env:"WEBHOOK_RETRY_FOR" envDefault:"24h" desc:"how long a failing webhook is retried"`
	BackoffMin     time.Duration `env:"WEBHOOK_BACKOFF_MIN" envDefault:"5s" desc:"delay after the first failed attempt (doubles each time, with jitter)"`
	BackoffMax     time.Duration `env:"WEBHOOK_BACKOFF_MAX" envDefault:"1h" desc:"longest delay between attempts"`
	Workers        int           `env:"WEBHOOK_WORKERS" envDefault:"4" desc:"webhook requests sent at once by this instance"`
	Lease          time.Duration `env:"WEBHOOK_LEASE" envDefault:"1m" desc:"how long a delivery is reserved for the instance sending it (a dead instance's deliveries are retried after it); at least twice WEBHOOK_TIMEOUT"`
}

// SigningKeyBytes returns the webhook signing key (nil when webhooks are
// disabled), reading WEBHOOK_SIGNING_KEY_FILE when it is set.
func (c *WebhookConfig) SigningKeyBytes() ([]byte, error) {
	if c.SigningKeyFile != "" {
		b, err := os.ReadFile(c.SigningKeyFile)
		if err != nil {
			return nil, service.Invalid("WEBHOOK_SIGNING_KEY_FILE", "%v", err)
		}
		k := strings.TrimSpace(string(b))
		if len(k) < 32 {
			return nil, service.Invalid("WEBHOOK_SIGNING_KEY_FILE", "the key must be at least 32 characters")
		}
		return []byte(k), nil
	}
	if c.SigningKey.IsZero() {
		return nil, nil
	}
	return c.SigningKey.Bytes(), nil
}

// Validate checks the settings.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Signing.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.SecretRefs.Authorizer(); err != nil {
		errs = append(errs, err)
	}
	if _, err := authz.ParsePools(c.Pools.Projects); err != nil {
		errs = append(errs, service.Invalid(authz.PoolsSetting, "%v", err))
	}
	if err := c.Special.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Credentials.Vault.Validate(); err != nil {
		errs = append(errs, service.Invalid("CREDENTIALS_VAULT_ADDR", "%v", err))
	}
	if !strings.Contains(c.Credentials.Path, "{project_id}") || !strings.Contains(c.Credentials.Path, "{name}") {
		errs = append(errs, service.Invalid("CREDENTIALS_VAULT_PATH", "must hold {project_id} and {name}"))
	}
	for _, part := range []string{"{project_id}", "{launch}", "{variable}"} {
		if !strings.Contains(c.Credentials.LaunchPath, part) {
			errs = append(errs, service.Invalid("CREDENTIALS_VAULT_LAUNCH_PATH", "must hold {project_id}, {launch} and {variable}"))
			break
		}
	}
	if c.API.Addr == "" {
		errs = append(errs, service.Invalid("API_ADDR", "must not be empty"))
	}
	if c.API.MaxBody < 1024 {
		errs = append(errs, service.Invalid("API_MAX_BODY", "must be at least 1024"))
	}
	if c.API.MaxWait <= 0 {
		errs = append(errs, service.Invalid("API_MAX_WAIT", "must be positive"))
	}
	if c.API.RateLimit < 1 || c.API.RateBurst < 1 || c.API.AuthFailureRate < 1 {
		errs = append(errs, service.Invalid("API_RATE_LIMIT", "rates and burst must be at least 1"))
	}
	if _, err := c.API.TLS(); err != nil {
		errs = append(errs, err)
	}
	if c.API.KeyCacheTTL < 0 {
		errs = append(errs, service.Invalid("API_KEY_CACHE_TTL", "must not be negative"))
	}
	errs = append(errs, c.Console.validate()...)
	if c.Keep.Deployments < 0 {
		errs = append(errs, service.Invalid("DEPLOYMENT_RETENTION", "must not be negative"))
	}
	if c.Keep.IdempotencyKeys < 0 {
		errs = append(errs, service.Invalid("IDEMPOTENCY_KEY_TTL", "must not be negative"))
	}
	if c.Stream.Group == "" {
		errs = append(errs, service.Invalid("STREAM_GROUP", "must not be empty"))
	}
	if c.Stream.Concurrency < 1 {
		errs = append(errs, service.Invalid("STREAM_CONCURRENCY", "must be at least 1"))
	}
	if !c.Webhooks.SigningKey.IsZero() && c.Webhooks.SigningKeyFile != "" {
		errs = append(errs, service.Invalid("WEBHOOK_SIGNING_KEY", "set only one of WEBHOOK_SIGNING_KEY and WEBHOOK_SIGNING_KEY_FILE"))
	}
	if !c.Webhooks.SigningKey.IsZero() && c.Webhooks.SigningKey.Len() < 32 {
		errs = append(errs, service.Invalid("WEBHOOK_SIGNING_KEY", "must be at least 32 characters"))
	}
	if _, err := webhooks.ParseCIDRs(c.Webhooks.AllowCIDRs); err != nil {
		errs = append(errs, service.Invalid("WEBHOOK_ALLOW_CIDRS", "%v", err))
	}
	if c.Webhooks.Timeout <= 0 || c.Webhooks.RetryFor <= 0 || c.Webhooks.BackoffMin <= 0 || c.Webhooks.BackoffMax < c.Webhooks.BackoffMin {
		errs = append(errs, service.Invalid("WEBHOOK_TIMEOUT", "webhook durations must be positive, WEBHOOK_BACKOFF_MAX >= WEBHOOK_BACKOFF_MIN"))
	}
	webhooksOn := !c.Webhooks.SigningKey.IsZero() || c.Webhooks.SigningKeyFile != ""
	if webhooksOn && c.Webhooks.Lease < 2*c.Webhooks.Timeout {
		errs = append(errs, service.Invalid("WEBHOOK_LEASE", "must be at least twice WEBHOOK_TIMEOUT (an attempt must end well within its lease)"))
	}
	if c.Webhooks.Workers < 1 {
		errs = append(errs, service.Invalid("WEBHOOK_WORKERS", "must be at least 1"))
	}
	return errors.Join(errs...)
}

// NewConfig returns a Config holding the service's own defaults, ready for
// service.Load and service.Usage.
func NewConfig() *Config {
	return &Config{Common: service.Common{AdminAddr: DefaultAdminAddr}}
}
