// Package sshcheck checks, before any play, that a server can be reached
// over SSH: a TCP connection, an SSH handshake presenting the expected host
// key, and authentication with the service's keys, retried with exponential
// backoff and jitter while the server is unreachable.
//
// Host keys follow a Policy: trust on first use (pin the first key seen,
// enforce it afterwards), strict (a pinned key is required) or off. The
// caller keeps the pins (pkg/store PinServerHostKey / PinHostKey) and feeds
// Result.HostKey to Ansible's known_hosts.
package sshcheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// Policy says how host keys are checked.
type Policy string

// The host key policies.
const (
	// PolicyTOFU (the default) accepts and reports the key of a target with
	// none pinned (Result.FirstUse, for the caller to pin), and requires the
	// pinned key afterwards.
	PolicyTOFU Policy = "tofu"
	// PolicyStrict requires a pinned key: a target without one fails with
	// ErrNotPinned before anything is dialed.
	PolicyStrict Policy = "strict"
	// PolicyOff accepts any host key, even one differing from the pin.
	// Insecure (anyone in the middle gets the session); logged loudly.
	PolicyOff Policy = "off"
)

// UnmarshalText parses a policy ("" is PolicyTOFU), so that Policy can be a
// configuration field.
func (p *Policy) UnmarshalText(text []byte) error {
	switch v := Policy(strings.ToLower(strings.TrimSpace(string(text)))); v {
	case "":
		*p = PolicyTOFU
	case PolicyTOFU, PolicyStrict, PolicyOff:
		*p = v
	default:
		return fmt.Errorf("unknown ssh host key policy %q (want tofu, strict or off)", string(text))
	}
	return nil
}

// Target is the SSH endpoint to check.
type Target struct {
	Address string
	Port    int // 0 means 22
	User    string
	// PinnedKey is the pinned host key in authorized_keys format
	// ("ssh-ed25519 AAAA..."; a trailing comment is ignored), "" for none.
	PinnedKey string
}

// Config tunes a Checker. Every field must be set (New validates, it fills
// no defaults): the infra service's configuration (SSH_*) holds them.
type Config struct {
	// Attempts is how many times the target is tried while unreachable.
	Attempts int
	// BaseDelay is the wait before the second attempt; each further wait
	// is Factor times longer, up to MaxDelay.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	Factor    float64
	// Jitter spreads each wait uniformly over ±Jitter of it (0.2: ±20%; 0:
	// none), so that checks failing together do not retry together; below
	// 1. A wait never exceeds MaxDelay.
	Jitter float64
	// AttemptTimeout bounds one attempt: connect, handshake and
	// authentication.
	AttemptTimeout time.Duration
	Policy         Policy
}

// Validate reports every problem of the configuration.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.Attempts < 1 {
		errs = append(errs, fmt.Errorf("attempts %d < 1", cfg.Attempts))
	}
	if cfg.BaseDelay < 0 || cfg.MaxDelay < cfg.BaseDelay {
		errs = append(errs, fmt.Errorf("delays must satisfy 0 <= base (%s) <= max (%s)", cfg.BaseDelay, cfg.MaxDelay))
	}
	if !(cfg.Factor >= 1) || math.IsInf(cfg.Factor, 0) { // also NaN
		errs = append(errs, fmt.Errorf("backoff factor %v: want a finite number >= 1", cfg.Factor))
	}
	if !(cfg.Jitter >= 0 && cfg.Jitter < 1) { // also NaN
		errs = append(errs, fmt.Errorf("jitter %v: want 0 <= jitter < 1", cfg.Jitter))
	}
	if cfg.AttemptTimeout <= 0 {
		errs = append(errs, fmt.Errorf("attempt timeout %s: want > 0", cfg.AttemptTimeout))
	}
	switch cfg.Policy {
	case PolicyTOFU, PolicyStrict, PolicyOff:
	default:
		errs = append(errs, fmt.Errorf("host key policy %q: want tofu, strict or off", string(cfg.Policy)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ssh check: %w", err)
	}
	return nil
}

// BackOff returns the waits between the attempts of one check (not safe
// for concurrent use): cenkalti/backoff's exponential backoff from
// BaseDelay by Factor up to MaxDelay, spread by Jitter, and capped at
// MaxDelay after the spread too.
func (cfg Config) BackOff() backoff.BackOff {
	return &cappedBackOff{
		ExponentialBackOff: backoff.ExponentialBackOff{
			InitialInterval:     cfg.BaseDelay,
			RandomizationFactor: cfg.Jitter,
			Multiplier:          cfg.Factor,
			MaxInterval:         cfg.MaxDelay,
		},
		max: cfg.MaxDelay,
	}
}

// cappedBackOff keeps the jitter from taking a wait above the maximum.
type cappedBackOff struct {
	backoff.ExponentialBackOff
	max time.Duration
}

func (b *cappedBackOff) NextBackOff() time.Duration {
	return min(b.ExponentialBackOff.NextBackOff(), b.max)
}

// Checker checks SSH reachability; it is safe for concurrent use.
type Checker struct {
	cfg     Config
	log     zerolog.Logger
	clock   clock.Clock
	metrics Metrics
	dialer  net.Dialer
}

// Option customises a Checker.
type Option func(*Checker)

// WithClock replaces the clock that waits between attempts and times them
// (tests record the waits and return at once). nil keeps the system clock.
func WithClock(c clock.Clock) Option { return func(ch *Checker) { ch.clock = cmp.Or(c, ch.clock) } }

// WithMetrics reports every attempt to m. nil reports nothing.
func WithMetrics(m Metrics) Option { return func(c *Checker) { c.metrics = cmp.Or(m, c.metrics) } }

// New returns a Checker for cfg, which must be valid (see Config).
func New(cfg Config, log zerolog.Logger, opts ...Option) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Checker{
		cfg: cfg, log: log, clock: clock.System(),
		metrics: MetricsFunc(func(Class, time.Duration) {}),
	}
	for _, o := range opts {
		o(c)
	}
	if cfg.Policy == PolicyOff {
		log.Warn().Str("ssh_host_key_policy", string(PolicyOff)).
			Msg("SSH HOST KEY CHECKING IS OFF: any host key is accepted, a man in the middle gets the session (insecure)")
	}
	return c, nil
}

// Config returns the configuration.
func (c *Checker) Config() Config { return c.cfg }

// Attempt is one try of a check.
type Attempt struct {
	Number   int           // 1-based
	Delay    time.Duration // waited before it (0 for the first)
	Duration time.Duration // how long it took
	Class    Class         // ClassOK on success
	Err      error         // nil on success
}

// Result is what a check found.
type Result struct {
	// HostKey is the host key the server presented (authorized_keys
	// format, no comment), "" when no handshake got that far.
	HostKey string
	// FirstUse is true when the target had no pinned key and the policy is
	// trust on first use: the caller pins HostKey.
	FirstUse bool
	// Attempts lists every attempt made, in order.
	Attempts []Attempt
}

// Check opens an SSH session to t and authenticates with signers (the
// caller's keys, from secrets), retrying while the target is unreachable
// (Config.Attempts, with backoff). The Result is returned also on failure
// (what was tried). Errors: *UnreachableError after the last attempt,
// *HostKeyMismatchError and *AuthError at once (retrying cannot help),
// ErrNotPinned (strict policy, nothing dialed), the context's error
// (wrapped) when ctx ends, and a plain error for an invalid target.
func (c *Checker) Check(ctx context.Context, t Target, signers []ssh.Signer) (*Result, error) {
	if t.Port == 0 {
		t.Port = 22
	}
	addr := hostPort(t.Address, t.Port)
	res := &Result{}
	switch {
	case t.Address == "":
		return res, errors.New("ssh check: empty address")
	case t.Port < 1 || t.Port > 65535:
		return res, fmt.Errorf("ssh check %s: invalid port", addr)
	case t.User == "":
		return res, fmt.Errorf("ssh check %s: empty user", addr)
	case len(signers) == 0:
		return res, fmt.Errorf("ssh check %s: no client keys", addr)
	}
	var pinned ssh.PublicKey
	if strings.TrimSpace(t.PinnedKey) != "" {
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(t.PinnedKey))
		if err != nil {
			return res, fmt.Errorf("ssh check %s: parse pinned host key: %w", addr, err)
		}
		pinned = key
	}
	log := c.log.With().Str("address", t.Address).Int("port", t.Port).Logger()
	switch {
	case c.cfg.Policy == PolicyStrict && pinned == nil:
		return res, fmt.Errorf("ssh check %s: %w", addr, ErrNotPinned)
	case c.cfg.Policy == PolicyOff:
		log.Warn().Msg("checking SSH without host key verification (policy off, insecure)")
	}

	var last Attempt
	waits := c.cfg.BackOff()
	for n := 1; n <= c.cfg.Attempts; n++ {
		var delay time.Duration
		if n > 1 {
			delay = waits.NextBackOff()
			if err := clock.Sleep(ctx, c.clock, delay); err != nil {
				return res, fmt.Errorf("ssh check %s canceled after %d attempts (last: %s): %w", addr, n-1, last.Class, err)
			}
		}
		start := c.clock.Now()
		class, hostKey, err := c.attempt(ctx, addr, t, pinned, signers, log)
		last = Attempt{Number: n, Delay: delay, Duration: c.clock.Now().Sub(start), Class: class, Err: err}
		res.Attempts = append(res.Attempts, last)
		if hostKey != "" {
			res.HostKey = hostKey
		}
		c.metrics.AttemptDone(class, last.Duration)
		ev := log.Warn()
		if class == ClassOK {
			ev = log.Info()
		}
		ev.Int("attempt", n).Int("attempts", c.cfg.Attempts).Int64("delay_ms", delay.Milliseconds()).
			Float64("took_ms", float64(last.Duration.Microseconds())/1000).
			Str("class", string(class)).Err(err).Msg("ssh check attempt")

		switch class {
		case ClassOK:
			res.FirstUse = pinned == nil && c.cfg.Policy == PolicyTOFU
			if res.FirstUse {
				log.Info().Str("host_key_fingerprint", fingerprintOf(hostKey)).Msg("ssh host key seen for the first time")
			}
			return res, nil
		case ClassCanceled:
			return res, fmt.Errorf("ssh check %s canceled during attempt %d: %w", addr, n, ctx.Err())
		case ClassHostKeyMismatch, ClassAuth:
			return res, err
		}
	}
	return res, &UnreachableError{Address: t.Address, Port: t.Port, Attempts: len(res.Attempts), Class: last.Class, Err: last.Err}
}
