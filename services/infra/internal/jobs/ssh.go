package jobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// credentials are a run's SSH key, held only in memory.
type credentials struct {
	signers   []ssh.Signer
	keys      [][]byte // private keys for the run's in-process agent
	publicKey string   // authorized_keys line of the key
	clients   string   // fingerprints of the keys (see passedChecks)
}

// endpoint is where a run connects.
type endpoint struct {
	alias   string // inventory host name
	address string
	port    int
	user    string
}

// sshCredentials resolves the server's SSH key reference (or the default)
// and parses the key. A reference that cannot work ends the job (kind
// secret_unavailable); an unreachable secret backend is an infrastructure
// error, retried.
func (j *job) sshCredentials(ctx context.Context) (*credentials, error) {
	ref := j.h.cfg.DefaultSSHKeyRef
	if j.server != nil && j.server.SSHKeyRef != "" {
		ref = j.server.SSHKeyRef
		if err := CheckServerKeyRef(ref, j.h.cfg.OwnRefs); err != nil {
			j.log.Warn().Str("reason", err.Error()).Msg("server ssh_key_ref refused: nothing resolved")
			return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
		}
	}
	if ref == "" {
		return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%s", ErrNoSSHKey)
	}
	v, err := j.resolve(ctx, "ssh key", ref)
	if err != nil {
		return nil, err
	}
	defer v.Wipe()
	signer, err := ParseSSHKey(ref, v)
	if err != nil {
		return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
	}
	key := bytes.Clone(v.Bytes())
	return &credentials{
		signers:   []ssh.Signer{signer},
		keys:      [][]byte{key},
		publicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
		clients:   ssh.FingerprintSHA256(signer.PublicKey()),
	}, nil
}

// ErrNoSSHKey: a server without ssh_key_ref, and no SSH_KEY_REF.
var ErrNoSSHKey = errors.New("no SSH key: the server has no ssh_key_ref and SSH_KEY_REF is not set")

// CheckServerKeyRef refuses a server's ssh_key_ref that names a credential
// of the service that is no SSH key (own: the request signing keys' refs):
// such a secret is never read as a server's key. The error wraps
// service.ErrSecretRefused.
func CheckServerKeyRef(ref string, own []string) error {
	if authz.NamesAny(ref, own) {
		return fmt.Errorf("ssh_key_ref %s: %w: it names a request signing key of the service (REQUEST_KEYS)", ref, service.ErrSecretRefused)
	}
	return nil
}

// ParseSSHKey parses the SSH private key ref resolved to. The error wraps
// service.ErrSecretUnusable and never holds the parser's details: they may
// quote the key.
func ParseSSHKey(ref string, v secrets.Value) (ssh.Signer, error) {
	signer, err := ssh.ParsePrivateKey(v.Bytes())
	if err != nil {
		return nil, fmt.Errorf("secret %s is not a usable SSH private key (unencrypted OpenSSH or PEM): %w", ref, service.ErrSecretUnusable)
	}
	return signer, nil
}

// resolve resolves a secret reference for the job. Errors in the reference
// or its content end the job; an unavailable backend is retried.
func (j *job) resolve(ctx context.Context, what, ref string) (secrets.Value, error) {
	return j.resolveWith(ctx, j.res, what, ref)
}

// resolveWith resolves ref with res (the service's own resolver, or the
// project resolver for the references a request carries).
func (j *job) resolveWith(ctx context.Context, res *secrets.Resolver, what, ref string) (secrets.Value, error) {
	sctx, span := j.startSpan(ctx, spanSecret, attribute.String("autoprov.secret", what))
	v, err := res.Resolve(sctx, ref)
	endSpan(span, err)
	switch {
	case err == nil:
		return v, nil
	case secrets.IsUnavailable(err):
		return secrets.Value{}, fmt.Errorf("resolve %s: %w", what, err)
	default:
		return secrets.Value{}, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%s: %v", what, err)
	}
}

// pinnedKey returns the host key pinned for the endpoint ("" when none).
func (j *job) pinnedKey(ctx context.Context, ep endpoint) (string, error) {
	if j.server != nil {
		return j.server.HostKey, nil
	}
	return store.GetHostKey(ctx, j.h.DB, ep.address, ep.port)
}

// checkSSH checks that the endpoint answers SSH with the credentials, pins
// its host key on first use, and returns the pinned key. When the server
// stays down, or its key or ours is refused, the job's outcome is returned
// as the error. A check that passed moments ago for the same endpoint, host
// key and credentials stands in for a new one (Config.SSHCheckReuse).
func (j *job) checkSSH(ctx context.Context, ep endpoint, creds *credentials) (string, error) {
	defer j.steps.add(stepSSHCheck, time.Now())
	pinned, err := j.pinnedKey(ctx, ep)
	if err != nil {
		return "", fmt.Errorf("read pinned host key: %w", err)
	}
	key := keyOf(ep)
	if ago, ok := j.h.checks.reuse(ctx, key, pinned, creds.clients, j.h.Now()); ok {
		j.sshCheckReused = true
		j.h.Metrics.sshChecksReused.Inc()
		j.log.Debug().Dur("passed_ago", ago).Msg("SSH check skipped: the server passed one moments ago")
		return pinned, nil
	}
	checkStart := j.h.Now()
	sctx, span := j.startSpan(ctx, spanSSH, attribute.String("server.address", ep.address), attribute.Int("server.port", ep.port))
	res, err := j.h.SSH.Check(sctx, sshcheck.Target{Address: ep.address, Port: ep.port, User: ep.user, PinnedKey: pinned}, creds.signers)
	endSpan(span, err)
	j.sshCheck += j.h.Now().Sub(checkStart)
	if err != nil {
		j.h.checks.forget(ctx, key)
	}
	if err != nil && ctx.Err() == nil {
		// Our key refused, the host key changed, the server gone: no run
		// goes on through a connection opened before.
		j.h.Runner.CloseWarm(ep.alias)
	}
	var unreachable *sshcheck.UnreachableError
	var mismatch *sshcheck.HostKeyMismatchError
	var auth *sshcheck.AuthError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return "", context.Cause(ctx)
	case errors.As(err, &unreachable) && j.server == nil:
		// An unregistered target gets the words a refused one gets, without
		// the connection error: no probing of networks through infra.
		j.log.Warn().Str("error", err.Error()).Msg("unregistered deploy target did not answer SSH")
		return "", fail(messages.StatusUnreachable, messages.KindSSHUnreachable, "%s", authz.UnreachableMessage(ep.address, ep.port))
	case errors.As(err, &unreachable):
		return "", fail(messages.StatusUnreachable, messages.KindSSHUnreachable,
			"%s:%d did not answer SSH: %v", ep.address, ep.port, err)
	case errors.As(err, &mismatch):
		return "", fail(messages.StatusFailed, messages.KindHostKeyMismatch, "%v", err)
	case errors.As(err, &auth):
		return "", fail(messages.StatusFailed, messages.KindSSHAuthFailed,
			"%s@%s:%d rejected our SSH key: %v", ep.user, ep.address, ep.port, err)
	default:
		return "", fmt.Errorf("ssh check: %w", err)
	}
	if pinned == "" {
		if pinned, err = j.pinFirstKey(ctx, ep, res.HostKey); err != nil {
			return "", err
		}
	}
	j.h.checks.pass(ctx, key, pinned, creds.clients, j.h.Now())
	return pinned, nil
}

// pinFirstKey pins the host key a server presented on first use. Another
// instance may have pinned a different key meanwhile: then that one stands
// and the job ends with a mismatch.
func (j *job) pinFirstKey(ctx context.Context, ep endpoint, presented string) (string, error) {
	var pinned string
	var err error
	if j.server != nil {
		pinned, err = store.PinServerHostKey(ctx, j.h.DB, j.server.Handle, presented)
	} else {
		pinned, err = store.PinHostKey(ctx, j.h.DB, ep.address, ep.port, presented)
	}
	if err != nil {
		return "", fmt.Errorf("pin host key: %w", err)
	}
	if !sameKey(pinned, presented) {
		return "", fail(messages.StatusFailed, messages.KindHostKeyMismatch,
			"host key of %s:%d changed while it was being pinned", ep.address, ep.port)
	}
	j.log.Info().Str("host_key", keyFingerprint(pinned)).Msg("host key pinned on first use")
	return pinned, nil
}

// sameKey reports whether two authorized_keys lines hold the same key.
func sameKey(a, b string) bool {
	return len(strings.Fields(a)) >= 2 && keyLine(a) == keyLine(b)
}

// keyFingerprint returns the SHA256 fingerprint of an authorized_keys line.
func keyFingerprint(line string) string {
	pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return "(unparsable key)"
	}
	return ssh.FingerprintSHA256(pk)
}
