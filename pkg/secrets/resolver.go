package secrets

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// ResolverOptions configures a [Resolver]. A nil backend disables its
// scheme: references to it fail with [ErrDisabled].
type ResolverOptions struct {
	Env   *EnvBackend
	File  *FileBackend
	Vault *Vault
	// Redactor receives every resolved value (required).
	Redactor *Redactor
	// Logger gets one debug line per resolution (reference and backend,
	// never the value) and a warning for refused references.
	Logger zerolog.Logger
}

// Resolver turns secret references into values and registers every value
// with its Redactor. It is safe for concurrent use.
type Resolver struct {
	env   *EnvBackend
	file  *FileBackend
	vault *Vault
	red   *Redactor
	log   zerolog.Logger
}

// NewResolver returns a Resolver over the given backends.
func NewResolver(o ResolverOptions) (*Resolver, error) {
	if o.Redactor == nil {
		return nil, errors.New("secrets: resolver needs a Redactor")
	}
	return &Resolver{
		env:   o.Env,
		file:  o.File,
		vault: o.Vault,
		red:   o.Redactor,
		log:   o.Logger.With().Str("component", "secrets").Logger(),
	}, nil
}

// Deps are what [Open] needs besides the configuration.
type Deps struct {
	Logger zerolog.Logger
	// Redactor receives resolved values and the Vault token (required).
	Redactor *Redactor
	// LookupEnv reads the service's environment for env: references
	// (os.LookupEnv in services); nil disables env: references.
	LookupEnv func(string) (string, bool)
	// Clock drives Vault token renewal; nil means the system clock.
	Clock clock.Clock
	// HTTPClient for Vault; nil means vault-client-go's default.
	HTTPClient *http.Client
	// OnVaultEvent is passed to VaultOptions.OnEvent.
	OnVaultEvent func(VaultEvent)
}

// Open validates cfg and builds a Resolver with the configured backends,
// logging in to Vault when VAULT_ADDR is set. Call Start to keep the Vault
// token alive and Close when done.
func Open(ctx context.Context, cfg Config, deps Deps) (*Resolver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("secrets config: %w", err)
	}
	if deps.Redactor == nil {
		return nil, errors.New("secrets: Open needs a Redactor")
	}
	o := ResolverOptions{Redactor: deps.Redactor, Logger: deps.Logger}
	if deps.LookupEnv != nil {
		env, err := NewEnvBackend(cfg.EnvPrefix, deps.LookupEnv)
		if err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
		o.Env = env
	}
	if cfg.FileRoot != "" {
		f, err := NewFileBackend(cfg.FileRoot)
		if err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
		o.File = f
	}
	if cfg.Vault.Addr != "" {
		v, err := NewVault(ctx, cfg.Vault, VaultOptions{
			Logger:     deps.Logger,
			Clock:      deps.Clock,
			HTTPClient: deps.HTTPClient,
			Redactor:   deps.Redactor,
			OnEvent:    deps.OnVaultEvent,
		})
		if err != nil {
			if o.File != nil {
				_ = o.File.Close()
			}
			return nil, fmt.Errorf("secrets: %w", err)
		}
		o.Vault = v
	}
	return NewResolver(o)
}

// WithRedactor returns a Resolver sharing r's backends that registers
// values with red instead, typically a per-run child of r's Redactor.
func (r *Resolver) WithRedactor(red *Redactor) *Resolver {
	c := *r
	c.red = red
	return &c
}

// Redactor returns the Redactor values are registered with.
func (r *Resolver) Redactor() *Redactor { return r.red }

// Vault returns the Vault backend, nil when not configured.
func (r *Resolver) Vault() *Vault { return r.vault }

// Start starts the Vault token renewal loop, when Vault is configured.
func (r *Resolver) Start(ctx context.Context) error {
	if r.vault == nil {
		return nil
	}
	return r.vault.Start(ctx)
}

// Stop stops the Vault token renewal loop; idempotent.
func (r *Resolver) Stop() {
	if r.vault != nil {
		r.vault.Stop()
	}
}

// Close stops renewal and releases the backends.
func (r *Resolver) Close() error {
	var errs []error
	if r.vault != nil {
		errs = append(errs, r.vault.Close())
	}
	if r.file != nil {
		errs = append(errs, r.file.Close())
	}
	return errors.Join(errs...)
}

// Resolve parses ref and returns the secret it names, registered with the
// Resolver's Redactor. Errors are *[Error] values wrapping one of the kinds
// (ErrBadRef, ErrNotFound, ErrPermission, ErrUnavailable, ErrDisabled) and
// never contain the value.
func (r *Resolver) Resolve(ctx context.Context, ref string) (Value, error) {
	parsed, err := ParseRef(ref)
	if err != nil {
		r.log.Warn().Err(err).Msg("secret reference rejected")
		return Value{}, err
	}
	return r.ResolveRef(ctx, parsed)
}

// ResolveRef is [Resolver.Resolve] for a parsed reference.
func (r *Resolver) ResolveRef(ctx context.Context, ref Ref) (Value, error) {
	var (
		v     Value
		parts [][]byte
		err   error
	)
	switch ref.Scheme {
	case SchemeEnv:
		if r.env == nil {
			return Value{}, r.disabled(ref)
		}
		v, err = r.env.Resolve(ctx, ref)
	case SchemeFile:
		if r.file == nil {
			return Value{}, r.disabled(ref)
		}
		v, parts, err = r.file.resolve(ctx, ref)
	case SchemeVault:
		if r.vault == nil {
			return Value{}, r.disabled(ref)
		}
		v, parts, err = r.vault.resolve(ctx, ref)
	default:
		err = &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: "unknown scheme"}
	}
	if err != nil {
		ev := r.log.Debug()
		if IsBadRef(err) || errors.Is(err, ErrPermission) {
			ev = r.log.Warn()
		}
		ev.Str("ref", ref.String()).Err(err).Msg("secret not resolved")
		return Value{}, err
	}
	r.red.AddValue(v)
	for _, p := range parts {
		r.red.Add(p)
		clear(p)
	}
	r.log.Debug().Str("ref", ref.String()).Int("bytes", v.Len()).Msg("secret resolved")
	return v, nil
}

func (r *Resolver) disabled(ref Ref) error {
	err := &Error{Ref: ref.String(), Kind: ErrDisabled, Detail: string(ref.Scheme) + ": backend not configured"}
	r.log.Warn().Str("ref", ref.String()).Err(err).Msg("secret not resolved")
	return err
}
