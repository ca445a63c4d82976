package sshcheck_test

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// sleeps is a clock that records the waits between attempts and ends them
// at once; attempts are timed on the real clock.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

var _ clock.Clock = (*sleeps)(nil)

func (s *sleeps) Now() time.Time { return time.Now() }

func (s *sleeps) After(d time.Duration) <-chan time.Time {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	fired := make(chan time.Time, 1)
	fired <- time.Now()
	return fired
}

func (s *sleeps) got() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// defaults are the infra service's defaults (SSH_* in its configuration).
var defaults = sshcheck.Config{
	Attempts:       3,
	BaseDelay:      2 * time.Second,
	MaxDelay:       30 * time.Second,
	Factor:         2,
	Jitter:         0.2,
	AttemptTimeout: 15 * time.Second,
	Policy:         sshcheck.PolicyTOFU,
}

// conf returns c with its zero fields set from defaults (a test's shorthand:
// New itself takes only complete configurations).
func conf(c sshcheck.Config) sshcheck.Config {
	return sshcheck.Config{
		Attempts:       cmp.Or(c.Attempts, defaults.Attempts),
		BaseDelay:      cmp.Or(c.BaseDelay, defaults.BaseDelay),
		MaxDelay:       cmp.Or(c.MaxDelay, defaults.MaxDelay),
		Factor:         cmp.Or(c.Factor, defaults.Factor),
		Jitter:         cmp.Or(c.Jitter, defaults.Jitter),
		AttemptTimeout: cmp.Or(c.AttemptTimeout, defaults.AttemptTimeout),
		Policy:         cmp.Or(c.Policy, defaults.Policy),
	}
}

type harness struct {
	checker *sshcheck.Checker
	sleeps  *sleeps
	log     *testenv.SafeBuffer
}

// newChecker returns a checker whose waits are recorded, not slept, and
// whose log is kept (and shown when the test fails). Zero fields of cfg
// take the defaults.
func newChecker(t *testing.T, cfg sshcheck.Config, opts ...sshcheck.Option) *harness {
	t.Helper()
	h := &harness{sleeps: &sleeps{}, log: &testenv.SafeBuffer{}}
	c, err := sshcheck.New(conf(cfg), zerolog.New(h.log), append([]sshcheck.Option{sshcheck.WithClock(h.sleeps)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	h.checker = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("checker log:\n%s", h.log.String())
		}
	})
	return h
}

func signers(t *testing.T, pemKey []byte) []ssh.Signer {
	t.Helper()
	s, err := ssh.ParsePrivateKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	return []ssh.Signer{s}
}

func target(d *testenv.SSHD, pinned string) sshcheck.Target {
	return sshcheck.Target{Address: d.Host, Port: d.Port, User: d.User, PinnedKey: pinned}
}

func check(t *testing.T, h *harness, tg sshcheck.Target, keys []ssh.Signer) (*sshcheck.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.checker.Check(ctx, tg, keys)
	if res == nil {
		t.Fatalf("Check returned no result (err %v)", err)
	}
	return res, err
}

func classes(res *sshcheck.Result) []sshcheck.Class {
	var out []sshcheck.Class
	for _, a := range res.Attempts {
		out = append(out, a.Class)
	}
	return out
}

// keyBody is the base64 part of an authorized_keys line.
func keyBody(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return line
	}
	return f[1]
}

// First use: the key presented is returned for pinning; the caller pins it
// in Postgres, and the next check enforces the pin.
func TestFirstUseThenPinned(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	h := newChecker(t, sshcheck.Config{})
	keys := signers(t, d.ClientKey)

	res, err := check(t, h, target(d, ""), keys)
	if err != nil {
		t.Fatal(err)
	}
	if !res.FirstUse || res.HostKey != d.HostKey {
		t.Fatalf("first use: FirstUse=%v HostKey=%q, want true and %q", res.FirstUse, res.HostKey, d.HostKey)
	}
	if len(res.Attempts) != 1 || res.Attempts[0].Class != sshcheck.ClassOK || res.Attempts[0].Delay != 0 || res.Attempts[0].Err != nil {
		t.Fatalf("attempts = %+v", res.Attempts)
	}

	// The caller pins the key where the orchestration keeps it.
	ctx := context.Background()
	pool := testenv.Pool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port) VALUES ('web-1', $1, $2)`, d.Host, d.Port); err != nil {
		t.Fatal(err)
	}
	pinned, err := store.PinServerHostKey(ctx, pool, "web-1", res.HostKey)
	if err != nil || pinned != res.HostKey {
		t.Fatalf("pin: %q %v", pinned, err)
	}
	srv, err := store.GetServer(ctx, pool, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	res, err = check(t, h, sshcheck.Target{Address: srv.Address, Port: srv.SSHPort, User: d.User, PinnedKey: srv.HostKey}, keys)
	if err != nil {
		t.Fatal(err)
	}
	if res.FirstUse || res.HostKey != d.HostKey {
		t.Fatalf("pinned check: FirstUse=%v HostKey=%q", res.FirstUse, res.HostKey)
	}
	if len(h.sleeps.got()) != 0 {
		t.Fatalf("successful checks waited: %v", h.sleeps.got())
	}
	// The log names the target and each attempt, never key material.
	log := h.log.String()
	if !strings.Contains(log, `"address":"127.0.0.1"`) || !strings.Contains(log, `"attempt":1`) || !strings.Contains(log, `"class":"ok"`) {
		t.Fatalf("log lacks attempt fields:\n%s", log)
	}
	for _, secret := range []string{keyBody(d.ClientPublicKey), keyBody(d.HostKey), "PRIVATE KEY"} {
		if strings.Contains(log, secret) {
			t.Fatalf("log contains key material %q", secret)
		}
	}
}

func TestPinnedKeyEnforced(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	reg := prometheus.NewRegistry()
	m, err := sshcheck.NewPrometheusMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := newChecker(t, sshcheck.Config{}, sshcheck.WithMetrics(m))
	keys := signers(t, d.ClientKey)
	old := d.HostKey

	// A comment after the pinned key does not matter.
	if res, err := check(t, h, target(d, old+" root@web-1"), keys); err != nil || res.FirstUse {
		t.Fatalf("right pin: FirstUse=%v err=%v", res.FirstUse, err)
	}

	d.RotateHostKey() // reinstalled, or someone in the middle
	res, err := check(t, h, target(d, old), keys)
	var mismatch *sshcheck.HostKeyMismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("rotated key: err = %v, want *HostKeyMismatchError", err)
	}
	if mismatch.Expected != old || mismatch.Got != d.HostKey || mismatch.Port != d.Port {
		t.Fatalf("mismatch = %+v, want expected %q got %q", mismatch, old, d.HostKey)
	}
	if !strings.Contains(err.Error(), "SHA256:") {
		t.Fatalf("mismatch error without fingerprints: %v", err)
	}
	// No retry: a changed key fails at once.
	if got := classes(res); len(got) != 1 || got[0] != sshcheck.ClassHostKeyMismatch || len(h.sleeps.got()) != 0 {
		t.Fatalf("attempts %v, waits %v: want one host_key_mismatch attempt and no wait", got, h.sleeps.got())
	}
	if res.HostKey != d.HostKey {
		t.Fatalf("result host key %q, want the presented %q", res.HostKey, d.HostKey)
	}
	want := `
# HELP autoprov_ssh_attempts_total SSH reachability check attempts, by result class.
# TYPE autoprov_ssh_attempts_total counter
autoprov_ssh_attempts_total{result="host_key_mismatch"} 1
autoprov_ssh_attempts_total{result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoprov_ssh_attempts_total"); err != nil {
		t.Fatal(err)
	}
	if _, err := sshcheck.NewPrometheusMetrics(reg); err == nil {
		t.Fatal("registering the metrics twice did not fail")
	}
}

// A server with several host keys presents the pinned one, whatever its
// type; first use pins ed25519.
func TestPinnedKeyOfEachType(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{ExtraHostKeyTypes: []string{"rsa", "ecdsa"}})
	h := newChecker(t, sshcheck.Config{})
	keys := signers(t, d.ClientKey)

	res, err := check(t, h, target(d, ""), keys)
	if err != nil {
		t.Fatal(err)
	}
	if res.HostKey != d.HostKeys[0] || !strings.HasPrefix(res.HostKey, "ssh-ed25519 ") {
		t.Fatalf("first use pinned %q, want the ed25519 key %q", res.HostKey, d.HostKeys[0])
	}
	for _, pin := range d.HostKeys {
		res, err := check(t, h, target(d, pin), keys)
		if err != nil {
			t.Fatalf("pin %s: %v", strings.Fields(pin)[0], err)
		}
		if res.HostKey != pin {
			t.Fatalf("pin %s: server presented %q", strings.Fields(pin)[0], res.HostKey)
		}
	}
}

// A pinned key of a type the server no longer has is a changed key too.
func TestPinnedKeyTypeGone(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{}) // ed25519 only
	h := newChecker(t, sshcheck.Config{})
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(&priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pin := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	res, err := check(t, h, target(d, pin), signers(t, d.ClientKey))
	var mismatch *sshcheck.HostKeyMismatchError
	if !errors.As(err, &mismatch) || mismatch.Expected != pin || mismatch.Got != "" {
		t.Fatalf("err = %v (%+v), want a mismatch with nothing presented", err, mismatch)
	}
	if len(res.Attempts) != 1 {
		t.Fatalf("attempts = %v", classes(res))
	}
}

func TestAuthRejectedNotRetried(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := ssh.NewSignerFromKey(other)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		user string
		keys []ssh.Signer
	}{
		{"unknown key", d.User, []ssh.Signer{stranger}},
		{"user not allowed", "nobody", signers(t, d.ClientKey)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newChecker(t, sshcheck.Config{})
			tg := target(d, d.HostKey)
			tg.User = tc.user
			res, err := check(t, h, tg, tc.keys)
			var auth *sshcheck.AuthError
			if !errors.As(err, &auth) {
				t.Fatalf("err = %v, want *AuthError", err)
			}
			var unreachable *sshcheck.UnreachableError
			if auth.User != tc.user || errors.As(err, &unreachable) {
				t.Fatalf("auth error = %+v", auth)
			}
			if got := classes(res); len(got) != 1 || got[0] != sshcheck.ClassAuth || len(h.sleeps.got()) != 0 {
				t.Fatalf("attempts %v, waits %v: want one auth attempt", got, h.sleeps.got())
			}
			// The host key was verified before authentication failed.
			if res.HostKey != d.HostKey {
				t.Fatalf("host key %q", res.HostKey)
			}
		})
	}
}

func TestClosedPortUnreachableWithBackoff(t *testing.T) {
	port := testenv.ClosedPort(t)
	tg := sshcheck.Target{Address: "127.0.0.1", Port: port, User: "root"}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keys := []ssh.Signer{s}
	base := 100 * time.Millisecond
	cfg := sshcheck.Config{BaseDelay: base, MaxDelay: time.Second, Jitter: 0.2}

	// With the real random source: delays grow from base to 2x base, each
	// within the jitter bounds.
	h := newChecker(t, cfg)
	res, err := check(t, h, tg, keys)
	var unreachable *sshcheck.UnreachableError
	if !errors.As(err, &unreachable) {
		t.Fatalf("err = %v, want *UnreachableError", err)
	}
	if unreachable.Attempts != 3 || unreachable.Class != sshcheck.ClassRefused || unreachable.Port != port {
		t.Fatalf("unreachable = %+v", unreachable)
	}
	got := classes(res)
	if len(got) != 3 || got[0] != sshcheck.ClassRefused || got[2] != sshcheck.ClassRefused {
		t.Fatalf("attempts = %v, want 3 refused", got)
	}
	waits := h.sleeps.got()
	if len(waits) != 2 {
		t.Fatalf("waits = %v, want 2 (between 3 attempts)", waits)
	}
	for i, w := range waits {
		nominal := base << i
		lo, hi := time.Duration(float64(nominal)*0.8), time.Duration(float64(nominal)*1.2)
		if w < lo || w > hi {
			t.Fatalf("wait %d = %s, want within [%s, %s]", i+1, w, lo, hi)
		}
		if res.Attempts[i+1].Delay != w {
			t.Fatalf("attempt %d records delay %s, slept %s", i+2, res.Attempts[i+1].Delay, w)
		}
	}
	if waits[1] <= waits[0] {
		t.Fatalf("waits do not grow: %v", waits)
	}

	// Without jitter the waits are exact, and capped at MaxDelay.
	exact := func(attempts int, base, maxDelay time.Duration, factor float64) sshcheck.Config {
		return sshcheck.Config{Attempts: attempts, BaseDelay: base, MaxDelay: maxDelay, Factor: factor,
			AttemptTimeout: time.Second, Policy: sshcheck.PolicyTOFU}
	}
	for _, tc := range []struct {
		cfg  sshcheck.Config
		want []time.Duration
	}{
		{exact(3, base, time.Second, 2), []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{exact(5, time.Second, 3*time.Second, 2), []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{exact(4, time.Second, 3*time.Second, 3), []time.Duration{time.Second, 3 * time.Second, 3 * time.Second}},
		{exact(3, 0, 0, 1), nil}, // zero delays: no wait at all
	} {
		h := &harness{sleeps: &sleeps{}, log: &testenv.SafeBuffer{}}
		c, err := sshcheck.New(tc.cfg, zerolog.New(h.log), sshcheck.WithClock(h.sleeps))
		if err != nil {
			t.Fatal(err)
		}
		h.checker = c
		if _, err := check(t, h, tg, keys); !errors.As(err, &unreachable) {
			t.Fatalf("err = %v", err)
		}
		if got := h.sleeps.got(); !equalDurations(got, tc.want) {
			t.Fatalf("cfg=%+v: waits %v, want %v", tc.cfg, got, tc.want)
		}
	}
}

// The jitter spreads each wait over its bounds and never above MaxDelay,
// over many checks' worth of waits.
func TestBackOffJitter(t *testing.T) {
	cfg := sshcheck.Config{Attempts: 6, BaseDelay: time.Second, MaxDelay: 6 * time.Second, Factor: 2, Jitter: 0.5,
		AttemptTimeout: time.Second, Policy: sshcheck.PolicyTOFU}
	nominal := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 6 * time.Second, 6 * time.Second}
	lows, highs := make([]int, len(nominal)), make([]int, len(nominal))
	const draws = 2000
	for range draws {
		waits := cfg.BackOff()
		for i, n := range nominal {
			d := waits.NextBackOff()
			lo, hi := time.Duration(float64(n)*(1-cfg.Jitter)), min(time.Duration(float64(n)*(1+cfg.Jitter)), cfg.MaxDelay)
			if d < lo || d > hi {
				t.Fatalf("wait %d = %s, want within [%s, %s]", i+1, d, lo, hi)
			}
			switch {
			case d < n:
				lows[i]++
			case d > n:
				highs[i]++
			}
		}
	}
	for i := range nominal {
		// Uniform over ±50%: about half below the nominal wait; above it
		// too, except where MaxDelay caps the spread.
		if lows[i] < draws/4 || (nominal[i] < cfg.MaxDelay && highs[i] < draws/4) {
			t.Errorf("wait %d: %d below and %d above %s in %d draws: not spread", i+1, lows[i], highs[i], nominal[i], draws)
		}
		if nominal[i] == cfg.MaxDelay && highs[i] != 0 {
			t.Errorf("wait %d went above MaxDelay %d times", i+1, highs[i])
		}
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		// Float arithmetic may be off by a nanosecond.
		if d := a[i] - b[i]; d < -time.Microsecond || d > time.Microsecond {
			return false
		}
	}
	return true
}

// A hung sshd accepts TCP (the kernel does) but never sends its banner:
// each attempt times out, then the target is unreachable; once it resumes
// the check succeeds.
func TestPausedSSHDTimesOut(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	keys := signers(t, d.ClientKey)
	timeout := 300 * time.Millisecond
	h := newChecker(t, sshcheck.Config{Attempts: 2, AttemptTimeout: timeout})

	d.Pause()
	res, err := check(t, h, target(d, d.HostKey), keys)
	var unreachable *sshcheck.UnreachableError
	if !errors.As(err, &unreachable) || unreachable.Class != sshcheck.ClassBannerTimeout {
		t.Fatalf("err = %v, want *UnreachableError with class banner_timeout", err)
	}
	if got := classes(res); len(got) != 2 || got[0] != sshcheck.ClassBannerTimeout || got[1] != sshcheck.ClassBannerTimeout {
		t.Fatalf("attempts = %v", got)
	}
	for _, a := range res.Attempts {
		if a.Duration < timeout {
			t.Fatalf("attempt %d gave up after %s, before the %s timeout", a.Number, a.Duration, timeout)
		}
	}

	d.Resume()
	h = newChecker(t, sshcheck.Config{AttemptTimeout: 10 * time.Second})
	if _, err := check(t, h, target(d, d.HostKey), keys); err != nil {
		t.Fatalf("after resume: %v", err)
	}
}

// Fault injection with in-test TCP servers: a port that accepts and hangs
// up, and one that speaks another protocol.
func TestHandshakeFaults(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		serve func(net.Conn)
		want  sshcheck.Class
	}{
		{"hang up", func(c net.Conn) { _ = c.Close() }, sshcheck.ClassNoBanner},
		{"not ssh", func(c net.Conn) {
			_, _ = c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
			_ = c.Close()
		}, sshcheck.ClassHandshake},
		{"banner then silence", func(c net.Conn) {
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			_, _ = io.Copy(io.Discard, c) // until the client gives up
			_ = c.Close()
		}, sshcheck.ClassHandshakeTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go tc.serve(c)
				}
			}()
			port := ln.Addr().(*net.TCPAddr).Port
			h := newChecker(t, sshcheck.Config{Attempts: 2, AttemptTimeout: 500 * time.Millisecond})
			res, err := check(t, h, sshcheck.Target{Address: "127.0.0.1", Port: port, User: "root"}, []ssh.Signer{s})
			var unreachable *sshcheck.UnreachableError
			if !errors.As(err, &unreachable) || unreachable.Class != tc.want || len(res.Attempts) != 2 {
				t.Fatalf("err = %v, attempts %v: want unreachable after 2 %s attempts", err, classes(res), tc.want)
			}
		})
	}
}

func TestStrictPolicy(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	h := newChecker(t, sshcheck.Config{Policy: sshcheck.PolicyStrict})
	keys := signers(t, d.ClientKey)

	res, err := check(t, h, target(d, ""), keys)
	if !errors.Is(err, sshcheck.ErrNotPinned) || len(res.Attempts) != 0 {
		t.Fatalf("strict without pin: err = %v after %d attempts, want ErrNotPinned before dialing", err, len(res.Attempts))
	}
	res, err = check(t, h, target(d, d.HostKey), keys)
	if err != nil || res.FirstUse {
		t.Fatalf("strict with pin: FirstUse=%v err=%v", res.FirstUse, err)
	}
}

func TestPolicyOffAcceptsAnyKey(t *testing.T) {
	d := testenv.StartSSHD(t, testenv.SSHDOptions{})
	h := newChecker(t, sshcheck.Config{Policy: sshcheck.PolicyOff})
	old := d.HostKey
	d.RotateHostKey()
	res, err := check(t, h, target(d, old), signers(t, d.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	if res.HostKey != d.HostKey || res.FirstUse {
		t.Fatalf("policy off: HostKey=%q FirstUse=%v", res.HostKey, res.FirstUse)
	}
	if log := h.log.String(); !strings.Contains(log, "OFF") || !strings.Contains(log, "differs from the pinned") {
		t.Fatalf("policy off not logged loudly:\n%s", log)
	}
}

func TestContextCancelStopsRetrying(t *testing.T) {
	port := testenv.ClosedPort(t)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	tg := sshcheck.Target{Address: "127.0.0.1", Port: port, User: "root"}

	t.Run("while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Real sleeps of an hour: only the cancel can end the wait.
		c, err := sshcheck.New(conf(sshcheck.Config{BaseDelay: time.Hour, MaxDelay: time.Hour}), zerolog.Nop(),
			sshcheck.WithMetrics(sshcheck.MetricsFunc(func(sshcheck.Class, time.Duration) { cancel() })))
		if err != nil {
			t.Fatal(err)
		}
		res, err := checkWithin(t, 10*time.Second, func() (*sshcheck.Result, error) { return c.Check(ctx, tg, []ssh.Signer{s}) })
		var unreachable *sshcheck.UnreachableError
		if !errors.Is(err, context.Canceled) || errors.As(err, &unreachable) || len(res.Attempts) != 1 {
			t.Fatalf("err = %v after %d attempts, want context.Canceled after 1", err, len(res.Attempts))
		}
	})

	t.Run("during an attempt", func(t *testing.T) {
		// A server that accepts and then never speaks, like a hung sshd:
		// the cancel comes once it accepted, with the attempt connected and
		// waiting for the banner (an hour's attempt timeout).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
			cancel()
		}()
		c, err := sshcheck.New(conf(sshcheck.Config{AttemptTimeout: time.Hour}), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		hung := sshcheck.Target{Address: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port, User: "root"}
		res, err := checkWithin(t, 10*time.Second, func() (*sshcheck.Result, error) {
			return c.Check(ctx, hung, []ssh.Signer{s})
		})
		if !errors.Is(err, context.Canceled) || len(res.Attempts) != 1 || res.Attempts[0].Class != sshcheck.ClassCanceled {
			t.Fatalf("err = %v, attempts %v: want one canceled attempt", err, classes(res))
		}
	})
}

// checkWithin runs check and fails the test when it does not return within
// limit (far longer than a prompt return needs, far shorter than the
// configured waits).
func checkWithin(t *testing.T, limit time.Duration, check func() (*sshcheck.Result, error)) (*sshcheck.Result, error) {
	t.Helper()
	type out struct {
		res *sshcheck.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := check()
		done <- out{res, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(limit):
		t.Fatalf("Check did not return within %s of the cancel", limit)
		return nil, nil
	}
}

func TestConfig(t *testing.T) {
	c, err := sshcheck.New(defaults, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config(); got != defaults {
		t.Fatalf("Config() = %+v, want %+v", got, defaults)
	}
	// No defaults are filled in: every field must be valid.
	for _, tc := range []struct {
		name string
		edit func(*sshcheck.Config)
		want string
	}{
		{"zero attempts", func(c *sshcheck.Config) { c.Attempts = 0 }, "attempts 0 < 1"},
		{"negative base", func(c *sshcheck.Config) { c.BaseDelay = -time.Second }, "delays must satisfy"},
		{"max below base", func(c *sshcheck.Config) { c.BaseDelay, c.MaxDelay = time.Minute, time.Second }, "delays must satisfy"},
		{"zero factor", func(c *sshcheck.Config) { c.Factor = 0 }, "backoff factor 0"},
		{"factor below 1", func(c *sshcheck.Config) { c.Factor = 0.5 }, "backoff factor 0.5"},
		{"jitter 1", func(c *sshcheck.Config) { c.Jitter = 1 }, "jitter 1"},
		{"negative jitter", func(c *sshcheck.Config) { c.Jitter = -0.1 }, "jitter -0.1"},
		{"zero attempt timeout", func(c *sshcheck.Config) { c.AttemptTimeout = 0 }, "attempt timeout 0s"},
		{"no policy", func(c *sshcheck.Config) { c.Policy = "" }, `host key policy ""`},
		{"unknown policy", func(c *sshcheck.Config) { c.Policy = "yolo" }, `host key policy "yolo"`},
	} {
		cfg := defaults
		tc.edit(&cfg)
		if _, err := sshcheck.New(cfg, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	_, err = sshcheck.New(sshcheck.Config{}, zerolog.Nop())
	for _, want := range []string{"attempts 0", "backoff factor 0", "attempt timeout 0s", `host key policy ""`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero Config: New = %v, want every problem listed, %q too", err, want)
		}
	}
	for in, want := range map[string]sshcheck.Policy{"": sshcheck.PolicyTOFU, "TOFU": sshcheck.PolicyTOFU, " strict ": sshcheck.PolicyStrict, "off": sshcheck.PolicyOff} {
		var p sshcheck.Policy
		if err := p.UnmarshalText([]byte(in)); err != nil || p != want {
			t.Errorf("policy %q = %q, %v; want %q", in, p, err, want)
		}
	}
	var p sshcheck.Policy
	if err := p.UnmarshalText([]byte("none")); err == nil {
		t.Error("policy none accepted")
	}

	// Invalid targets fail before dialing.
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s, _ := ssh.NewSignerFromKey(key)
	for _, tg := range []sshcheck.Target{
		{Port: 22, User: "root"},
		{Address: "127.0.0.1", Port: 70000, User: "root"},
		{Address: "127.0.0.1", User: ""},
		{Address: "127.0.0.1", User: "root", PinnedKey: "not a key"},
	} {
		res, err := c.Check(context.Background(), tg, []ssh.Signer{s})
		if err == nil || len(res.Attempts) != 0 {
			t.Errorf("target %+v: err = %v after %d attempts", tg, err, len(res.Attempts))
		}
	}
	if res, err := c.Check(context.Background(), sshcheck.Target{Address: "127.0.0.1", User: "root"}, nil); err == nil || len(res.Attempts) != 0 {
		t.Errorf("no keys: err = %v", err)
	}
}
