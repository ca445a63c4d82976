package time4vps

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultURL              = "https://billing.time4vps.com/api"
	DefaultTimeout          = 30 * time.Second
	DefaultConnectTimeout   = 10 * time.Second
	DefaultTaskPollInterval = 10 * time.Second
	DefaultRetryMax         = 4
	DefaultRetryWaitMin     = 500 * time.Millisecond
	DefaultRetryWaitMax     = 30 * time.Second
)

// Secret is a string that never prints: fmt, zerolog's Interface and JSON
// encoding all show "[REDACTED]". Convert with string(s) where the value is
// really needed.
type Secret string

const redacted = "[REDACTED]"

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return redacted }

// MarshalText implements encoding.TextMarshaler.
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Config configures a Client. Parse it with github.com/caarlos0/env/v11; a zero
// field takes the default named in its envDefault tag.
type Config struct {
	URL              string        `env:"TIME4VPS_URL" envDefault:"https://billing.time4vps.com/api" desc:"Time4VPS API base URL"`
	Username         string        `env:"TIME4VPS_USERNAME" desc:"Time4VPS client area username (email)"`
	Password         Secret        `env:"TIME4VPS_PASSWORD" scrub:"true" desc:"Time4VPS client area password (secret; prefer TIME4VPS_PASSWORD_FILE)"`
	PasswordFile     string        `env:"TIME4VPS_PASSWORD_FILE" desc:"file holding the Time4VPS password (one line)"`
	Timeout          time.Duration `env:"TIME4VPS_TIMEOUT" envDefault:"30s" desc:"timeout of one HTTP attempt, response body included"`
	ConnectTimeout   time.Duration `env:"TIME4VPS_CONNECT_TIMEOUT" envDefault:"10s" desc:"TCP connect and TLS handshake timeout"`
	TaskPollInterval time.Duration `env:"TIME4VPS_TASK_POLL_INTERVAL" envDefault:"10s" desc:"interval between task status polls while waiting for a task"`
	RetryMax         int           `env:"TIME4VPS_RETRY_MAX" envDefault:"4" desc:"retries of a failed GET (network error, 429, 5xx); negative disables; POSTs are never retried"`
	RetryWaitMin     time.Duration `env:"TIME4VPS_RETRY_WAIT_MIN" envDefault:"500ms" desc:"first backoff wait between GET retries (doubles, with jitter)"`
	RetryWaitMax     time.Duration `env:"TIME4VPS_RETRY_WAIT_MAX" envDefault:"30s" desc:"longest wait between GET retries; a longer Retry-After ends the retries"`
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, DefaultURL)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.TaskPollInterval = cmp.Or(c.TaskPollInterval, DefaultTaskPollInterval)
	c.RetryMax = max(cmp.Or(c.RetryMax, DefaultRetryMax), 0) // negative: no retries
	c.RetryWaitMin = cmp.Or(c.RetryWaitMin, DefaultRetryWaitMin)
	c.RetryWaitMax = cmp.Or(c.RetryWaitMax, DefaultRetryWaitMax)
	return c
}

// resolve applies defaults, loads the password file and validates. Errors never
// contain the password.
func (c Config) resolve() (Config, error) {
	c = c.withDefaults()
	var errs []error

	u, err := url.Parse(c.URL)
	switch {
	case err != nil:
		// url.Parse errors quote the input, which may hold credentials.
		errs = append(errs, errors.New("TIME4VPS_URL is not a valid URL"))
	case u.Scheme != "https" && u.Scheme != "http":
		errs = append(errs, fmt.Errorf("TIME4VPS_URL scheme must be https or http, not %q", u.Scheme))
	case u.Host == "":
		errs = append(errs, errors.New("TIME4VPS_URL has no host"))
	case u.User != nil:
		errs = append(errs, errors.New("TIME4VPS_URL must not hold credentials: use TIME4VPS_USERNAME and TIME4VPS_PASSWORD(_FILE)"))
	case u.RawQuery != "" || u.Fragment != "":
		errs = append(errs, errors.New("TIME4VPS_URL must not have a query or fragment"))
	default:
		c.URL = strings.TrimRight(u.String(), "/")
	}

	if strings.TrimSpace(c.Username) == "" {
		errs = append(errs, errors.New("TIME4VPS_USERNAME is required"))
	}
	switch {
	case c.Password != "" && c.PasswordFile != "":
		errs = append(errs, errors.New("set only one of TIME4VPS_PASSWORD and TIME4VPS_PASSWORD_FILE"))
	case c.PasswordFile != "":
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("read TIME4VPS_PASSWORD_FILE: %w", err))
			break
		}
		c.Password = Secret(strings.TrimRight(string(b), "\r\n"))
		if c.Password == "" {
			errs = append(errs, fmt.Errorf("TIME4VPS_PASSWORD_FILE %s is empty", c.PasswordFile))
		}
	case c.Password == "":
		errs = append(errs, errors.New("TIME4VPS_PASSWORD or TIME4VPS_PASSWORD_FILE is required"))
	}

	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"TIME4VPS_TIMEOUT", c.Timeout},
		{"TIME4VPS_CONNECT_TIMEOUT", c.ConnectTimeout},
		{"TIME4VPS_TASK_POLL_INTERVAL", c.TaskPollInterval},
		{"TIME4VPS_RETRY_WAIT_MIN", c.RetryWaitMin},
		{"TIME4VPS_RETRY_WAIT_MAX", c.RetryWaitMax},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", d.name, d.v))
		}
	}
	if c.RetryWaitMax < c.RetryWaitMin {
		errs = append(errs, fmt.Errorf("TIME4VPS_RETRY_WAIT_MAX (%s) is below TIME4VPS_RETRY_WAIT_MIN (%s)", c.RetryWaitMax, c.RetryWaitMin))
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("time4vps config: %w", errors.Join(errs...))
	}
	return c, nil
}
