package secrets

import (
	"context"
	"fmt"
	"slices"
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
	prefix   string
	lookup   func(string) (string, bool)
	reserved map[string]bool
}

// NewEnvBackend returns an env backend allowing names that start with
// prefix, looked up with lookup (os.LookupEnv in services). reserved are
// the variables the service itself reads (its configuration): the prefix
// must not reach any of them, and none is ever resolved.
func NewEnvBackend(prefix string, lookup func(string) (string, bool), reserved ...string) (*EnvBackend, error) {
	if err := validateEnvPrefix(prefix, reserved...); err != nil {
		return nil, err
	}
	if lookup == nil {
		return nil, fmt.Errorf("env backend: nil lookup function")
	}
	e := &EnvBackend{prefix: prefix, lookup: lookup, reserved: make(map[string]bool, len(reserved))}
	for _, n := range reserved {
		e.reserved[n] = true
	}
	return e, nil
}

// LookupIn turns a getenv function (a service's environment, as
// service.Deps.Getenv gives it) into a lookup for Deps.LookupEnv; an empty
// variable counts as unset.
func LookupIn(getenv func(string) string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v := getenv(name)
		return v, v != ""
	}
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
	if e.reserved[ref.Path] || isSensitiveEnv(ref.Path) {
		return Value{}, &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: "variable belongs to the service's own configuration"}
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

// sensitiveEnvNames are variables of our own configuration, and of the
// libraries we use, that an env: prefix must never reach, whatever the
// service says it reads.
var sensitiveEnvNames = []string{
	"VAULT_TOKEN", "VAULT_TOKEN_FILE", "VAULT_SECRET_ID", "VAULT_SECRET_ID_FILE", "VAULT_ROLE_ID", "VAULT_ADDR",
	"PROJECT_VAULT_TOKEN", "PROJECT_VAULT_TOKEN_FILE", "PROJECT_VAULT_SECRET_ID", "PROJECT_VAULT_SECRET_ID_FILE",
	"PROJECT_VAULT_ROLE_ID", "PROJECT_VAULT_ADDR", "PROJECT_SECRETS_ENV_PREFIX", "PROJECT_SECRETS_FILE_ROOT",
	"SECRETS_ENV_PREFIX", "SECRETS_FILE_ROOT", "DATABASE_URL", "DATABASE_URL_FILE", "REDIS_URL", "REDIS_URL_FILE",
	"REDIS_SENTINEL_PASSWORD", "TIME4VPS_USERNAME", "TIME4VPS_PASSWORD", "TIME4VPS_PASSWORD_FILE",
	"SSH_KEY_REF", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGSSLKEY",
}

// sensitiveEnvPrefixes start variables of our own configuration or of our
// libraries (pgx reads PG*, vault-client-go VAULT_*).
var sensitiveEnvPrefixes = []string{"VAULT_", "SECRETS_", "PROJECT_VAULT_", "PROJECT_SECRETS_", "TIME4VPS_", "DATABASE_", "REDIS_", "PG"}

func isSensitiveEnv(name string) bool {
	for _, p := range sensitiveEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// validateEnvPrefix checks that p is a variable name prefix that reaches
// none of the service's own variables: neither the sensitive ones nor any
// of reserved.
func validateEnvPrefix(p string, reserved ...string) error {
	if len(p) < 4 {
		return fmt.Errorf("env prefix %q: must be at least 4 characters", p)
	}
	if !validEnvName(p) || !strings.HasSuffix(p, "_") {
		return fmt.Errorf("env prefix %q: must be a variable name prefix ending in _", p)
	}
	for _, n := range append(slices.Clone(sensitiveEnvNames), reserved...) {
		if strings.HasPrefix(n, p) {
			return fmt.Errorf("env prefix %q: would allow %s, which the service reads itself", p, n)
		}
	}
	for _, sp := range sensitiveEnvPrefixes {
		if strings.HasPrefix(p, sp) || strings.HasPrefix(sp, p) {
			return fmt.Errorf("env prefix %q: must not overlap %s, variables the service or its libraries read", p, sp)
		}
	}
	return nil
}
