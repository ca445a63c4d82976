package secrets

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// DefaultProjectVaultPaths is the Vault policy path the project resolver
// may read unless PROJECT_VAULT_ALLOWED_PATHS says otherwise: the paths of
// deploy/vault/infra-projects.hcl.
const DefaultProjectVaultPaths = "secret/data/projects/*"

// ProjectConfig configures the backends of the secret references that
// requests carry (a deploy's github_token_ref and secrets_ref), apart from
// the service's own (Config: its SSH keys). Services embed it with
// envPrefix "PROJECT_", so its variables are PROJECT_VAULT_ADDR,
// PROJECT_VAULT_TOKEN, ..., PROJECT_SECRETS_ENV_PREFIX,
// PROJECT_SECRETS_FILE_ROOT and PROJECT_VAULT_ALLOWED_PATHS.
//
// Each backend is off unless configured: vault: references need a Vault
// login of their own (a token or AppRole other than the service's, whose
// policy covers project paths only), file: references a root of their own
// that does not overlap SECRETS_FILE_ROOT, env: references a prefix of
// their own that does not overlap SECRETS_ENV_PREFIX. So a request can
// never resolve what only the service may read.
type ProjectConfig struct {
	EnvPrefix string `env:"SECRETS_ENV_PREFIX" scrub:"prefix" desc:"prefix of the variables env: references in requests may read, apart from SECRETS_ENV_PREFIX (empty: env: references in requests are refused)"`
	FileRoot  string `env:"SECRETS_FILE_ROOT" desc:"absolute directory file: references in requests are read from, apart from SECRETS_FILE_ROOT (empty: file: references in requests are refused)"`
	// VaultPaths are the only KV v2 API paths the project Vault client
	// reads: the paths of its token's policy (deploy/vault/infra-projects.hcl).
	VaultPaths []string `env:"VAULT_ALLOWED_PATHS" envDefault:"secret/data/projects/*" envSeparator:"," desc:"Vault policy paths references in requests may read; others fail before any request"`
	Vault      VaultConfig
}

// Validate checks the project configuration on its own; OpenProject also
// checks it against the service's own Config.
func (c ProjectConfig) Validate() error {
	var errs []error
	if c.EnvPrefix != "" {
		if err := validateEnvPrefix(c.EnvPrefix); err != nil {
			errs = append(errs, fmt.Errorf("PROJECT_SECRETS_ENV_PREFIX: %w", err))
		}
	}
	if c.FileRoot != "" && !filepath.IsAbs(c.FileRoot) {
		errs = append(errs, fmt.Errorf("PROJECT_SECRETS_FILE_ROOT: %q is not an absolute path", c.FileRoot))
	}
	if c.Vault.Addr != "" && len(c.VaultPaths) == 0 {
		errs = append(errs, errors.New("PROJECT_VAULT_ALLOWED_PATHS: required with PROJECT_VAULT_ADDR"))
	}
	for _, p := range c.VaultPaths {
		if err := checkPolicyPath(p); err != nil {
			errs = append(errs, fmt.Errorf("PROJECT_VAULT_ALLOWED_PATHS: %w", err))
		}
	}
	if err := c.Vault.validate("PROJECT_"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Separate checks that the project backends reach nothing of the service's
// own configuration own: another Vault login, a file root that neither
// holds nor lies inside the service's, an env prefix that does not overlap
// the service's.
func (c ProjectConfig) Separate(own Config) error {
	var errs []error
	if c.EnvPrefix != "" && own.EnvPrefix != "" &&
		(strings.HasPrefix(c.EnvPrefix, own.EnvPrefix) || strings.HasPrefix(own.EnvPrefix, c.EnvPrefix)) {
		errs = append(errs, fmt.Errorf("PROJECT_SECRETS_ENV_PREFIX %q overlaps SECRETS_ENV_PREFIX %q: requests could read the service's own variables", c.EnvPrefix, own.EnvPrefix))
	}
	if c.FileRoot != "" && own.FileRoot != "" && pathsOverlap(c.FileRoot, own.FileRoot) {
		errs = append(errs, fmt.Errorf("PROJECT_SECRETS_FILE_ROOT %q overlaps SECRETS_FILE_ROOT %q: requests could read the service's own files", c.FileRoot, own.FileRoot))
	}
	if c.Vault.Addr != "" && own.Vault.Addr != "" {
		p, o := c.Vault, own.Vault
		switch {
		case !p.Token.IsZero() && !o.Token.IsZero() && p.Token.Reveal() == o.Token.Reveal(),
			p.TokenFile != "" && p.TokenFile == o.TokenFile,
			p.RoleID != "" && p.RoleID == o.RoleID && strings.TrimSuffix(p.AppRoleMount, "/") == strings.TrimSuffix(o.AppRoleMount, "/"):
			errs = append(errs, errors.New("PROJECT_VAULT_*: the same Vault login as VAULT_*: references in requests need a token or AppRole of their own, whose policy covers project paths only"))
		}
	}
	return errors.Join(errs...)
}

// pathsOverlap reports whether a and b are the same directory or one lies
// inside the other, after symbolic links are resolved where they exist.
func pathsOverlap(a, b string) bool {
	real := func(p string) string {
		p = filepath.Clean(p)
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	a, b = real(a), real(b)
	inside := func(x, y string) bool {
		rel, err := filepath.Rel(y, x)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
	}
	return inside(a, b) || inside(b, a)
}

// OpenProject validates cfg, checks that it is separate from the service's
// own configuration own, and builds the Resolver for the references that
// requests carry. Backends that are not configured are disabled: their
// references fail with ErrDisabled. deps are as for Open; its Redactor
// receives the values (and the project Vault token).
func OpenProject(ctx context.Context, cfg ProjectConfig, own Config, deps Deps) (*Resolver, error) {
	if err := errors.Join(cfg.Validate(), cfg.Separate(own)); err != nil {
		return nil, fmt.Errorf("project secrets config: %w", err)
	}
	return open(ctx, backendsConfig{envPrefix: cfg.EnvPrefix, fileRoot: cfg.FileRoot, vault: cfg.Vault, vaultPaths: cfg.VaultPaths}, deps, "project secrets")
}
