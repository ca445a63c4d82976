package pattern_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

func TestMatchersAreTheirBoundedExpressions(t *testing.T) {
	for _, tc := range []struct {
		original string
		m        *pattern.Matcher
	}{
		{`^[A-Za-z_][A-Za-z0-9_]{0,127}$`, pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`, 128)},
		{`^[!-~]{1,255}$`, pattern.MustCompile(`^[!-~]+$`, 255)},
		{`^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`, pattern.MustCompileParts(`^[a-z0-9][a-z0-9_]*\.[a-z0-9][a-z0-9_]*$`, ".", 64)},
		{`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`,
			pattern.MustCompileParts(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$`, ".", 63)},
	} {
		t.Run(tc.original, func(t *testing.T) {
			patterntest.Same(t, tc.m, tc.original, 20000)
		})
	}
}

// The check itself must catch a matcher whose bound is off by one.
func TestSameCatchesAWrongBound(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() { recover() }() // Fatalf ends the check
		patterntest.Same(ft, pattern.MustCompile(`^[a-z]+$`, 9), `^[a-z]{1,10}$`, 2000)
	}()
	if !strings.Contains(ft.msg, "matcher says false") {
		t.Fatalf("a bound of 9 for {1,10} went unnoticed: %q", ft.msg)
	}
}

func TestString(t *testing.T) {
	if got, want := pattern.MustCompile(`^[a-z]+$`, 10).String(), `^[a-z]+$ (at most 10 characters)`; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
