// Package signing checks the producer signatures of requests (the wire
// contract's "sig" field, messages.Sign) before infra handles them: a
// request that no known producer signed for its stream is dead-lettered
// without a result, so that a writer that is not a producer can neither
// queue work nor, by borrowing a job id, disturb a real job's result.
package signing

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Modes of REQUEST_SIGNATURES.
const (
	// ModeOff ignores signatures.
	ModeOff = "off"
	// ModeVerify refuses entries whose signature does not verify, and
	// accepts unsigned ones (while producers are being given keys).
	ModeVerify = "verify"
	// ModeRequire refuses unsigned entries too.
	ModeRequire = "require"
)

// Config configures the check (caarlos0/env tags; desc is the --help line).
type Config struct {
	Mode string   `env:"REQUEST_SIGNATURES" envDefault:"verify" desc:"off (ignore request signatures), verify (refuse a request whose signature fails; accept unsigned ones) or require (refuse unsigned requests too)"`
	Keys []string `env:"REQUEST_KEYS" envSeparator:"," desc:"producer keys: <key_id>@<stream>[+<stream>...]=<secret reference of the key>, e.g. scheduler-1@provisioner:queue=vault:secret/infra/request-keys#scheduler-1"`
}

// KeySpec is one parsed REQUEST_KEYS entry.
type KeySpec struct {
	ID      string
	Streams []string
	Ref     string
}

// ParseKeys parses REQUEST_KEYS entries.
func (c Config) ParseKeys() ([]KeySpec, error) {
	var out []KeySpec
	var errs []error
	for _, k := range c.Keys {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		head, ref, ok := strings.Cut(k, "=")
		id, streams, ok2 := strings.Cut(head, "@")
		if !ok || !ok2 || id == "" || streams == "" || ref == "" {
			errs = append(errs, fmt.Errorf("REQUEST_KEYS: entry %d: want <key_id>@<stream>[+<stream>]=<secret reference>", len(out)+len(errs)+1))
			continue
		}
		if _, err := secrets.ParseRef(ref); err != nil {
			errs = append(errs, fmt.Errorf("REQUEST_KEYS: key %s: %w", id, err))
			continue
		}
		out = append(out, KeySpec{ID: id, Streams: strings.Split(streams, "+"), Ref: ref})
	}
	return out, errors.Join(errs...)
}

// Validate checks the mode and the keys.
func (c Config) Validate() error {
	var errs []error
	switch c.Mode {
	case ModeOff, ModeVerify, ModeRequire:
	default:
		errs = append(errs, fmt.Errorf("REQUEST_SIGNATURES: %q: want off, verify or require", c.Mode))
	}
	keys, err := c.ParseKeys()
	if err != nil {
		errs = append(errs, err)
	}
	if c.Mode == ModeRequire && len(keys) == 0 && err == nil {
		errs = append(errs, errors.New("REQUEST_SIGNATURES=require: REQUEST_KEYS lists no key"))
	}
	return errors.Join(errs...)
}

// Resolve resolves a secret reference (the service's own resolver).
type Resolve func(ctx context.Context, ref string) (secrets.Value, error)

// Checker checks request signatures. Create it with New.
type Checker struct {
	mode     string
	verifier *messages.Verifier // nil: no keys
	log      zerolog.Logger
}

// New validates cfg and reads the keys through resolve (they are secrets:
// resolve registers them with the service's redactor).
func New(ctx context.Context, cfg Config, resolve Resolve, log zerolog.Logger) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	specs, _ := cfg.ParseKeys()
	c := &Checker{mode: cfg.Mode, log: log.With().Str("component", "signing").Logger()}
	if cfg.Mode == ModeOff || len(specs) == 0 {
		return c, nil
	}
	keys := make([]messages.VerifierKey, 0, len(specs))
	for _, s := range specs {
		v, err := resolve(ctx, s.Ref)
		if err != nil {
			return nil, fmt.Errorf("REQUEST_KEYS: key %s: %w", s.ID, err)
		}
		keys = append(keys, messages.VerifierKey{ID: s.ID, Key: []byte(strings.TrimSpace(v.Reveal())), Streams: s.Streams})
		v.Wipe()
	}
	ver, err := messages.NewVerifier(keys...)
	for i := range keys {
		clear(keys[i].Key)
	}
	if err != nil {
		return nil, fmt.Errorf("REQUEST_KEYS: %w", err)
	}
	c.verifier = ver
	return c, nil
}

// Reasons of the dead-letter entries of refused requests (shared with the
// replaying side through package messages).
const (
	ReasonUnsigned     = messages.ReasonUnsigned
	ReasonBadSignature = messages.ReasonBadSignature
)

// Check decides whether the entry may be handled: nil, or a permanent
// error (stream.Permanent) that dead-letters it without a result.
func (c *Checker) Check(msg *stream.Message) error {
	if c.mode == ModeOff || (c.verifier == nil && c.mode == ModeVerify) {
		return nil
	}
	sig, _ := msg.Values[messages.SigField].(string)
	if sig == "" && c.mode == ModeVerify {
		return nil
	}
	if c.verifier == nil { // require without keys is refused by Validate
		return stream.Permanent(ReasonUnsigned, errors.New("no producer keys configured"))
	}
	id, err := c.verifier.Verify(msg.Stream, msg.Data(), sig)
	if err != nil {
		reason := ReasonBadSignature
		if errors.Is(err, messages.ErrUnsigned) {
			reason = ReasonUnsigned
		}
		c.log.Warn().Str("stream", msg.Stream).Str("msg_id", msg.ID).Str("reason", reason).Err(err).
			Msg("request refused: no known producer signed it; dead-lettered without a result")
		return stream.Permanent(reason, err)
	}
	c.log.Debug().Str("stream", msg.Stream).Str("msg_id", msg.ID).Str("key_id", id).Msg("request signature verified")
	return nil
}

// Handler wraps next: entries that fail Check are dead-lettered, never
// handed to next.
func (c *Checker) Handler(next stream.Handler) stream.Handler {
	return stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		if err := c.Check(msg); err != nil {
			return err
		}
		return next.Handle(ctx, msg)
	})
}
