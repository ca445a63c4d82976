package service

import (
	"errors"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"
)

// Defaults of the Common settings: the dev profile of scripts/services.sh.
const (
	DefaultRedisURL    = "redis://127.0.0.1:16379/0"
	DefaultDatabaseURL = "postgres://autoprov:autoprov@127.0.0.1:15432/autoprov?sslmode=disable"
)

// Common holds the settings every service has. A service embeds it in its
// own config struct and sets AdminAddr to its own default before Load:
//
//	cfg := &Config{Common: service.Common{AdminAddr: "127.0.0.1:9102"}}
type Common struct {
	Redis RedisConfig `envPrefix:"REDIS_"`

	DatabaseURL string `env:"DATABASE_URL" scrub:"true" envDefault:"postgres://autoprov:autoprov@127.0.0.1:15432/autoprov?sslmode=disable" desc:"Postgres URL (postgres://user:password@host:port/db?sslmode=...)"`
	// DatabaseURLFile names a file holding the Postgres URL: a password in
	// DATABASE_URL stays readable in /proc/<pid>/environ for the life of
	// the process, one in a file does not.
	DatabaseURLFile string `env:"DATABASE_URL_FILE" desc:"file holding the Postgres URL, read at start instead of DATABASE_URL (keeps its password out of the process environment)"`

	LogLevel  string `env:"LOG_LEVEL" envDefault:"info" desc:"log level: debug, info, warn or error"`
	LogFormat string `env:"LOG_FORMAT" envDefault:"auto" desc:"log format: json, console, or auto (console when stderr is a terminal, else json)"`

	AdminAddr string `env:"ADMIN_ADDR" desc:"host:port of the admin HTTP server (/healthz, /readyz, /metrics); a loopback address unless ADMIN_ALLOW_REMOTE is set"`
	// AdminAllowRemote allows an ADMIN_ADDR that is not a loopback
	// address: the admin endpoints have no authentication.
	AdminAllowRemote bool `env:"ADMIN_ALLOW_REMOTE" desc:"allow a non-loopback ADMIN_ADDR (the admin endpoints are unauthenticated: expose them to a trusted network only)"`

	Tracing TracingConfig

	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE" envDefault:"30s" desc:"how long a graceful shutdown may take after SIGINT/SIGTERM"`
}

// Validate checks the common settings; Load calls it. It first reads
// DATABASE_URL_FILE and REDIS_URL_FILE, when set, into the URLs.
func (c *Common) Validate() error {
	var errs []error
	if err := readSettingFile("DATABASE_URL_FILE", c.DatabaseURLFile, &c.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if err := c.Redis.ReadURLFile(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.Redis.Validate())
	if err := validateDatabaseURL(c.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, &FieldError{Var: "LOG_LEVEL", Err: err})
	}
	if err := checkFormat(c.LogFormat); err != nil {
		errs = append(errs, &FieldError{Var: "LOG_FORMAT", Err: err})
	}
	if c.AdminAddr == "" {
		errs = append(errs, Invalid("ADMIN_ADDR", "required but not set"))
	} else if host, _, err := net.SplitHostPort(c.AdminAddr); err != nil {
		errs = append(errs, Invalid("ADMIN_ADDR", "%q is not host:port", c.AdminAddr))
	} else if !IsLoopbackHost(host) && !c.AdminAllowRemote {
		errs = append(errs, Invalid("ADMIN_ADDR", "%q is not a loopback address, and /metrics and /readyz need no authentication: "+
			"listen on 127.0.0.1, or set ADMIN_ALLOW_REMOTE=true to serve them there anyway", c.AdminAddr))
	}
	if c.ShutdownGrace <= 0 {
		errs = append(errs, Invalid("SHUTDOWN_GRACE", "must be positive, got %s", c.ShutdownGrace))
	}
	return errors.Join(errs...)
}

// readSettingFile sets *dst to the content of the file path (white space
// around it trimmed), when path is set. Errors name the variable and the
// file, never the content.
func readSettingFile(name, path string, dst *string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Invalid(name, "%v", err)
	}
	v := strings.TrimSpace(string(b))
	clear(b)
	if v == "" {
		return Invalid(name, "%s is empty", path)
	}
	*dst = v
	return nil
}

// DatabaseURL returns the Postgres URL getenv names: DATABASE_URL, or the
// contents of DATABASE_URL_FILE; "" when neither is set.
func DatabaseURL(getenv func(string) string) (string, error) {
	v := getenv("DATABASE_URL")
	if v == "" {
		if err := readSettingFile("DATABASE_URL_FILE", getenv("DATABASE_URL_FILE"), &v); err != nil {
			return "", err
		}
	}
	return v, nil
}

// IsLoopbackHost reports whether host (of a host:port) is a loopback
// address or "localhost"; "" (every interface) and other names are not.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

// validateDatabaseURL checks the URL without echoing it (it holds a password).
func validateDatabaseURL(s string) error {
	if s == "" {
		return Invalid("DATABASE_URL", "required but not set")
	}
	u, err := url.Parse(s)
	if err != nil {
		return Invalid("DATABASE_URL", "not a valid URL")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return Invalid("DATABASE_URL", "scheme must be postgres:// or postgresql://, got %q", u.Scheme)
	}
	return nil
}
