package secrets

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// leakGuard collects every log line and error of a test and, when the test
// ends, fails it if any of them holds a value that must never appear there.
type leakGuard struct {
	logs   *safeBuffer
	log    zerolog.Logger
	mu     sync.Mutex
	errs   []string
	values []func() []string // evaluated at the end (e.g. tokens issued)
}

func newLeakGuard(t *testing.T) *leakGuard {
	g := &leakGuard{logs: &safeBuffer{}}
	g.log = zerolog.New(g.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	g.forbid(func() []string { return []string{canary, "Kanar1e"} })
	t.Cleanup(func() {
		var forbidden []string
		for _, f := range g.values {
			forbidden = append(forbidden, f()...)
		}
		logs := g.logs.String()
		g.mu.Lock()
		errs := strings.Join(g.errs, "\n")
		g.mu.Unlock()
		for _, v := range forbidden {
			if len(v) < MinSecretLength {
				continue
			}
			if strings.Contains(logs, v) {
				t.Errorf("a log line holds a forbidden value (%d bytes)", len(v))
			}
			if strings.Contains(errs, v) {
				t.Errorf("an error holds a forbidden value (%d bytes)", len(v))
			}
		}
		if testing.Verbose() {
			t.Logf("%d bytes of logs and %d errors scanned for %d forbidden values", len(logs), len(g.errs), len(forbidden))
		}
	})
	return g
}

// forbid adds values that must not appear in logs or errors.
func (g *leakGuard) forbid(f func() []string) { g.values = append(g.values, f) }

// seen records err (if any) for the final scan and returns it.
func (g *leakGuard) seen(err error) error {
	if err != nil {
		g.mu.Lock()
		g.errs = append(g.errs, err.Error(), strings.ReplaceAll(err.Error(), `\`, ""))
		g.mu.Unlock()
	}
	return err
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// safeBuffer is a bytes.Buffer safe for concurrent writers (the package
// cannot import testenv: testenv imports service, which imports secrets).
type safeBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
