package secrets

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// Config configures the secret backends. Services embed it in their own
// configuration (caarlos0/env v11 tags; desc is the one-line --help text).
// VAULT_TOKEN and VAULT_SECRET_ID are removed from the process environment
// once read (the env "unset" option), so no child process can inherit them.
type Config struct {
	EnvPrefix string `env:"SECRETS_ENV_PREFIX" envDefault:"AUTOPROV_SECRET_" scrub:"prefix" desc:"prefix an env: secret reference's variable name must have"`
	FileRoot  string `env:"SECRETS_FILE_ROOT" desc:"absolute directory file: secret references are read from (empty disables file: references)"`
	// VaultPaths, when set, are the only KV v2 API paths the Vault client
	// reads (the paths of its token's policy): others fail before any
	// request is made.
	VaultPaths []string `env:"VAULT_ALLOWED_PATHS" envSeparator:"," desc:"Vault policy paths this token may read, e.g. secret/data/infra/ssh/* (empty: no check before the request)"`
	Vault      VaultConfig
}

// VaultConfig configures the vault: backend. An empty Addr disables it.
// Authentication is exactly one of: Token, TokenFile, or RoleID with
// SecretID or SecretIDFile (AppRole).
type VaultConfig struct {
	Addr         string        `env:"VAULT_ADDR" desc:"Vault address, e.g. https://vault.example:8200 (empty disables vault: references)"`
	Token        Value         `env:"VAULT_TOKEN,unset" scrub:"true" desc:"Vault token (removed from the environment once read)"`
	TokenFile    string        `env:"VAULT_TOKEN_FILE" desc:"file holding the Vault token, re-read when the token stops working"`
	RoleID       string        `env:"VAULT_ROLE_ID" desc:"AppRole role_id (AppRole login instead of a token)"`
	SecretID     Value         `env:"VAULT_SECRET_ID,unset" scrub:"true" desc:"AppRole secret_id (removed from the environment once read)"`
	SecretIDFile string        `env:"VAULT_SECRET_ID_FILE" desc:"file holding the AppRole secret_id, re-read at every login"`
	AppRoleMount string        `env:"VAULT_APPROLE_MOUNT" envDefault:"approle" desc:"mount path of the AppRole auth method"`
	Namespace    string        `env:"VAULT_NAMESPACE" desc:"Vault Enterprise namespace (X-Vault-Namespace)"`
	CACert       string        `env:"VAULT_CACERT" desc:"PEM file of the CA that signed Vault's TLS certificate"`
	Timeout      time.Duration `env:"VAULT_TIMEOUT" envDefault:"10s" desc:"timeout of each Vault request"`
}

// Validate checks the configuration. The zero Config is invalid (it has no
// env prefix); one parsed by caarlos0/env gets the defaults.
func (c Config) Validate() error {
	var errs []error
	if err := validateEnvPrefix(c.EnvPrefix); err != nil {
		errs = append(errs, fmt.Errorf("SECRETS_ENV_PREFIX: %w", err))
	}
	if c.FileRoot != "" && !filepath.IsAbs(c.FileRoot) {
		errs = append(errs, fmt.Errorf("SECRETS_FILE_ROOT: %q is not an absolute path", c.FileRoot))
	}
	for _, p := range c.VaultPaths {
		if err := checkPolicyPath(p); err != nil {
			errs = append(errs, fmt.Errorf("VAULT_ALLOWED_PATHS: %w", err))
		}
	}
	if err := c.Vault.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Validate checks the Vault settings: all empty (Vault disabled), or an
// address with exactly one way to authenticate.
func (c VaultConfig) Validate() error { return c.validate("") }

// validate is Validate for the variables of a prefix ("PROJECT_").
func (c VaultConfig) validate(prefix string) error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(strings.ReplaceAll(format, "VAULT_", prefix+"VAULT_"), args...))
	}
	hasToken := !c.Token.IsZero()
	hasAppRole := c.RoleID != "" || !c.SecretID.IsZero() || c.SecretIDFile != ""
	if c.Addr == "" {
		if hasToken || c.TokenFile != "" || hasAppRole {
			add("VAULT_ADDR: empty, but Vault credentials are set")
		}
		return errors.Join(errs...)
	}
	u, err := url.Parse(c.Addr)
	switch {
	case err != nil:
		add("VAULT_ADDR: not a URL")
	case u.Scheme != "https" && u.Scheme != "http":
		add("VAULT_ADDR: scheme must be https or http")
	case u.Host == "":
		add("VAULT_ADDR: no host")
	case u.User != nil:
		add("VAULT_ADDR: must not hold credentials")
	}
	methods := 0
	if hasToken {
		methods++
	}
	if c.TokenFile != "" {
		methods++
	}
	if hasAppRole {
		methods++
	}
	switch {
	case methods == 0:
		add("vault: no credentials: set VAULT_TOKEN, VAULT_TOKEN_FILE, or VAULT_ROLE_ID with VAULT_SECRET_ID or VAULT_SECRET_ID_FILE")
	case methods > 1:
		add("vault: set only one of VAULT_TOKEN, VAULT_TOKEN_FILE and AppRole (VAULT_ROLE_ID)")
	}
	if hasAppRole {
		if c.RoleID == "" {
			add("VAULT_ROLE_ID: required with VAULT_SECRET_ID or VAULT_SECRET_ID_FILE")
		}
		switch {
		case c.SecretID.IsZero() && c.SecretIDFile == "":
			add("VAULT_SECRET_ID or VAULT_SECRET_ID_FILE: required with VAULT_ROLE_ID")
		case !c.SecretID.IsZero() && c.SecretIDFile != "":
			add("VAULT_SECRET_ID and VAULT_SECRET_ID_FILE: set only one")
		}
		if c.AppRoleMount == "" {
			add("VAULT_APPROLE_MOUNT: empty")
		} else if err := checkSegments(c.AppRoleMount); err != nil {
			add("VAULT_APPROLE_MOUNT: %s", err.Detail)
		}
	}
	if c.Timeout <= 0 {
		add("VAULT_TIMEOUT: must be positive")
	}
	return errors.Join(errs...)
}
