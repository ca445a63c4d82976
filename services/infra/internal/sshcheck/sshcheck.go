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
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
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

// Config tunes a Checker. Zero fields take the values of DefaultConfig.
type Config struct {
	// Attempts is how many times the target is tried while unreachable.
	Attempts int
	// BaseDelay is the wait before the second attempt; each further wait
	// is Factor times longer, up to MaxDelay.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	Factor    float64
	// Jitter spreads each wait uniformly over ±Jitter of it (0.2: ±20%),
	// so that checks failing together do not retry together; below 1. A
	// negative value means no jitter. The result never exceeds MaxDelay.
	Jitter float64
	// AttemptTimeout bounds one attempt: connect, handshake and
	// authentication.
	AttemptTimeout time.Duration
	Policy         Policy
}

// DefaultConfig returns the defaults: 3 attempts, waits of 2s then 4s
// (±20%, at most 30s), 15s per attempt, trust on first use.
func DefaultConfig() Config {
	return Config{
		Attempts:       3,
		BaseDelay:      2 * time.Second,
		MaxDelay:       30 * time.Second,
		Factor:         2,
		Jitter:         0.2,
		AttemptTimeout: 15 * time.Second,
		Policy:         PolicyTOFU,
	}
}

// Checker checks SSH reachability; it is safe for concurrent use.
type Checker struct {
	cfg     Config
	log     zerolog.Logger
	sleep   func(ctx context.Context, d time.Duration) error
	now     func() time.Time
	rand    func() float64
	metrics Metrics
	dialer  net.Dialer
}

// Option customises a Checker.
type Option func(*Checker)

// WithSleep replaces the wait between attempts (tests record the waits and
// return at once). sleep must return ctx's error when ctx ends first.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Checker) { c.sleep = sleep }
}

// WithClock replaces the clock that times attempts.
func WithClock(now func() time.Time) Option { return func(c *Checker) { c.now = now } }

// WithRand replaces the jitter's random source (values in [0, 1)).
func WithRand(rnd func() float64) Option { return func(c *Checker) { c.rand = rnd } }

// WithMetrics reports every attempt to m.
func WithMetrics(m Metrics) Option { return func(c *Checker) { c.metrics = m } }

// New returns a Checker for cfg (zero fields defaulted, see Config).
func New(cfg Config, log zerolog.Logger, opts ...Option) (*Checker, error) {
	def := DefaultConfig()
	if cfg.Attempts == 0 {
		cfg.Attempts = def.Attempts
	}
	if cfg.BaseDelay == 0 {
		cfg.BaseDelay = def.BaseDelay
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = max(def.MaxDelay, cfg.BaseDelay)
	}
	if cfg.Factor == 0 {
		cfg.Factor = def.Factor
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = def.Jitter
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = def.AttemptTimeout
	}
	if cfg.Policy == "" {
		cfg.Policy = def.Policy
	}
	switch {
	case cfg.Attempts < 1:
		return nil, fmt.Errorf("ssh check: attempts %d < 1", cfg.Attempts)
	case cfg.BaseDelay < 0 || cfg.MaxDelay < cfg.BaseDelay:
		return nil, fmt.Errorf("ssh check: delays must satisfy 0 <= base (%s) <= max (%s)", cfg.BaseDelay, cfg.MaxDelay)
	case cfg.Factor < 1 || math.IsInf(cfg.Factor, 0) || math.IsNaN(cfg.Factor):
		return nil, fmt.Errorf("ssh check: backoff factor %v: want a finite number >= 1", cfg.Factor)
	case !(cfg.Jitter < 1): // also NaN
		return nil, fmt.Errorf("ssh check: jitter %v >= 1", cfg.Jitter)
	case cfg.AttemptTimeout < 0:
		return nil, fmt.Errorf("ssh check: attempt timeout %s < 0", cfg.AttemptTimeout)
	}
	var p Policy
	if err := p.UnmarshalText([]byte(cfg.Policy)); err != nil {
		return nil, fmt.Errorf("ssh check: %w", err)
	}
	cfg.Policy = p
	cfg.Jitter = max(cfg.Jitter, 0)

	c := &Checker{
		cfg: cfg, log: log,
		sleep: sleepCtx, now: time.Now, rand: rand.Float64,
		metrics: MetricsFunc(func(Class, time.Duration) {}),
	}
	defaults := *c
	for _, o := range opts {
		o(c)
	}
	// A nil option value keeps the default.
	if c.sleep == nil {
		c.sleep = defaults.sleep
	}
	if c.now == nil {
		c.now = defaults.now
	}
	if c.rand == nil {
		c.rand = defaults.rand
	}
	if c.metrics == nil {
		c.metrics = defaults.metrics
	}
	if cfg.Policy == PolicyOff {
		log.Warn().Str("ssh_host_key_policy", string(PolicyOff)).
			Msg("SSH HOST KEY CHECKING IS OFF: any host key is accepted, a man in the middle gets the session (insecure)")
	}
	return c, nil
}

// Config returns the effective configuration (defaults applied).
func (c *Checker) Config() Config { return c.cfg }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Delay returns the wait before attempt retry+1 (retry 1 is the wait
// before the second attempt): BaseDelay·Factor^(retry-1), capped at
// MaxDelay, spread by Jitter (negative: none) with r (uniform in [0, 1)),
// never above MaxDelay.
func (cfg Config) Delay(retry int, r float64) time.Duration {
	d := float64(cfg.BaseDelay) * math.Pow(cfg.Factor, float64(retry-1))
	d = min(d, float64(cfg.MaxDelay))
	d *= 1 + max(cfg.Jitter, 0)*(2*r-1)
	return time.Duration(max(0, min(d, float64(cfg.MaxDelay))))
}

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
	for n := 1; n <= c.cfg.Attempts; n++ {
		var delay time.Duration
		if n > 1 {
			delay = c.cfg.Delay(n-1, c.rand())
			if err := c.sleep(ctx, delay); err != nil {
				return res, fmt.Errorf("ssh check %s canceled after %d attempts (last: %s): %w", addr, n-1, last.Class, err)
			}
		}
		start := c.now()
		class, hostKey, err := c.attempt(ctx, addr, t, pinned, signers, log)
		last = Attempt{Number: n, Delay: delay, Duration: c.now().Sub(start), Class: class, Err: err}
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
