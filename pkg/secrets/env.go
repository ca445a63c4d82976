package secrets

import (
	"context"
	"fmt"
	"strings"
)

// DefaultEnvPrefix is the prefix an env: reference's variable name must
// have unless configured otherwise (SECRETS_ENV_PREFIX).
const DefaultEnvPrefix = "AUTOPROV_SECRET_"

// EnvBackend resolves env:<NAME> references from the service's own
// environment, through an injected lookup function, and only for names
// that start with its prefix: a message must not be able to ask for
// env:VAULT_TOKEN or env:DATABASE_URL.
type EnvBackend struct {
	prefix string
	lookup func(string) (string, bool)
}

// NewEnvBackend returns an env backend allowing names that start with
// prefix, looked up with lookup (os.LookupEnv in services).
func NewEnvBackend(prefix string, lookup func(string) (string, bool)) (*EnvBackend, error) {
	if err := validateEnvPrefix(prefix); err != nil {
		return nil, err
	}
	if lookup == nil {
		return nil, fmt.Errorf("env backend: nil lookup function")
	}
	return &EnvBackend{prefix: prefix, lookup: lookup}, nil
}

// Prefix returns the prefix allowed names must have.
func (e *EnvBackend) Prefix() string { return e.prefix }

// Resolve returns the variable's value; the reference must be an env: one.
func (e *EnvBackend) Resolve(_ context.Context, ref Ref) (Value, error) {
	if ref.Scheme != SchemeEnv {
		return Value{}, &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: "not an env: reference"}
	}
	if !strings.HasPrefix(ref.Path, e.prefix) || len(ref.Path) == len(e.prefix) {
		return Value{}, &Error{Ref: ref.String(), Kind: ErrBadRef,
			Detail: fmt.Sprintf("variable name must start with %q", e.prefix)}
	}
	v, ok := e.lookup(ref.Path)
	if !ok {
		return Value{}, &Error{Ref: ref.String(), Kind: ErrNotFound, Detail: "variable not set"}
	}
	if v == "" {
		return Value{}, &Error{Ref: ref.String(), Kind: ErrNotFound, Detail: "variable is empty"}
	}
	return ValueFromString(v), nil
}

// sensitiveEnvNames are variables of our own configuration that an env:
// prefix must never reach.
var sensitiveEnvNames = []string{
	"VAULT_TOKEN", "VAULT_SECRET_ID", "VAULT_ROLE_ID", "VAULT_ADDR",
	"SECRETS_ENV_PREFIX", "SECRETS_FILE_ROOT", "DATABASE_URL", "REDIS_URL",
}

func validateEnvPrefix(p string) error {
	if len(p) < 4 {
		return fmt.Errorf("env prefix %q: must be at least 4 characters", p)
	}
	if !validEnvName(p) || !strings.HasSuffix(p, "_") {
		return fmt.Errorf("env prefix %q: must be a variable name prefix ending in _", p)
	}
	for _, n := range sensitiveEnvNames {
		if strings.HasPrefix(n, p) {
			return fmt.Errorf("env prefix %q: would allow %s", p, n)
		}
	}
	if strings.HasPrefix(p, "VAULT_") || strings.HasPrefix(p, "SECRETS_") {
		return fmt.Errorf("env prefix %q: must not start with VAULT_ or SECRETS_", p)
	}
	return nil
}
