package app

import (
	"bytes"
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/signing"
)

// openOwnSecrets opens the service's own resolver (VAULT_*, SECRETS_*):
// the SSH keys and the request signing keys. Components and the secret
// check open it alike.
func openOwnSecrets(ctx context.Context, cfg *Config, getenv func(string) string, log zerolog.Logger, red *secrets.Redactor) (*secrets.Resolver, error) {
	return secrets.Open(ctx, cfg.Secrets, secrets.Deps{Logger: log, Redactor: red, LookupEnv: secrets.LookupIn(getenv)})
}

// signingRefs are the references of the request signing keys: no request
// and no server's ssh_key_ref may name them.
func signingRefs(keys []signing.KeySpec) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k.Ref)
	}
	return out
}

// SecretChecks is infra's --check-secrets: SSH_KEY_REF and every
// REQUEST_KEYS key, resolved with the service's own resolver and checked
// as the service uses them (an SSH private key that parses, a signing key
// NewVerifier takes); and, handed in (--secret-refs), servers'
// ssh_key_ref, with the rules a job applies to them: refused when they
// name a signing key, resolved with the same resolver, parsed as an SSH
// key; an empty one stands for SSH_KEY_REF, which must then be set.
func SecretChecks(ctx context.Context, cfg *Config, getenv func(string) string) service.SecretChecker {
	keys, _ := cfg.Signing.ParseKeys() // validated with the config
	var c service.SecretChecker
	if cfg.SSH.KeyRef != "" {
		c.Refs = append(c.Refs, service.SecretRef{Source: "SSH_KEY_REF", Ref: cfg.SSH.KeyRef})
	}
	bySource := map[string]signing.KeySpec{}
	for _, k := range keys {
		src := "REQUEST_KEYS key " + k.ID
		c.Refs = append(c.Refs, service.SecretRef{Source: src, Ref: k.Ref})
		bySource[src] = k
	}
	own := signingRefs(keys)
	res, err := openOwnSecrets(ctx, cfg, getenv, zerolog.Nop(), secrets.NewRedactor())
	if err != nil {
		c.Err = err
		return c
	}
	c.Close = func() { _ = res.Close() }
	// An SSH key named by many servers is resolved once.
	sshKeys := map[string]error{}
	sshKey := func(ctx context.Context, ref string) error {
		if err, done := sshKeys[ref]; done {
			return err
		}
		err := checkSSHKey(ctx, res, ref)
		sshKeys[ref] = err
		return err
	}
	c.Check = func(ctx context.Context, r service.SecretRef) error {
		if r.Source == "SSH_KEY_REF" {
			return sshKey(ctx, r.Ref)
		}
		return checkSigningKey(ctx, res, bySource[r.Source])
	}
	c.Extra = func(ctx context.Context, r service.SecretRef) error {
		if r.Ref == "" {
			if cfg.SSH.KeyRef == "" {
				return fmt.Errorf("%w: %w", service.ErrSecretRefused, jobs.ErrNoSSHKey)
			}
			return sshKey(ctx, cfg.SSH.KeyRef)
		}
		if err := jobs.CheckServerKeyRef(r.Ref, own); err != nil {
			return err
		}
		return sshKey(ctx, r.Ref)
	}
	return c
}

// checkSSHKey resolves ref and parses it as a job does; the value is wiped.
func checkSSHKey(ctx context.Context, res *secrets.Resolver, ref string) error {
	v, err := res.Resolve(ctx, ref)
	if err != nil {
		return err
	}
	defer v.Wipe()
	_, err = jobs.ParseSSHKey(ref, v)
	return err
}

// checkSigningKey resolves a REQUEST_KEYS key and checks it as
// signing.New does (white space trimmed, at least
// messages.MinSigningKeyLen bytes; its id and streams are checked with the
// configuration); the value is wiped.
func checkSigningKey(ctx context.Context, res *secrets.Resolver, k signing.KeySpec) error {
	v, err := res.Resolve(ctx, k.Ref)
	if err != nil {
		return err
	}
	n := len(bytes.TrimSpace(v.Bytes()))
	v.Wipe()
	if n < messages.MinSigningKeyLen {
		return fmt.Errorf("%w: signing key %s: %d bytes, want at least %d", service.ErrSecretUnusable, k.ID, n, messages.MinSigningKeyLen)
	}
	return nil
}
