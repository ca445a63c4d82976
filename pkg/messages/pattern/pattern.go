// Package pattern holds validation patterns: regular expressions whose
// length limits are checked apart from the expression.
//
// Go's regexp package compiles a bounded repetition such as
// `[a-z0-9_]{0,252}` into 252 copies of its operand: one such pattern costs
// about 200 KB of allocations to compile and keeps tens of KB live. The
// validators of the wire contract hold dozens of them, compiled when a
// process starts, which made about 3 MB of every service's start-up heap.
// A Matcher pairs the unbounded expression (`[a-z0-9_]*`) with the bound
// (at most 253 bytes), which is the same set of strings when the expression
// matches ASCII only, as every pattern here does.
package pattern

import (
	"regexp"
	"strconv"
	"strings"
)

// Matcher matches a string against an expression and length limits.
type Matcher struct {
	re      *regexp.Regexp
	max     int    // most bytes of the whole string; 0: no limit
	sep     string // with partMax: what separates the parts
	partMax int    // most bytes of each part between seps; 0: no limit
}

// MustCompile returns a Matcher for expr whose matches are at most max
// bytes long (0: no limit). It panics when expr does not compile, like
// regexp.MustCompile: patterns are constants of the program.
func MustCompile(expr string, max int) *Matcher {
	return &Matcher{re: regexp.MustCompile(expr), max: max}
}

// MustCompileParts returns a Matcher for expr whose matches, split at sep,
// have parts of at most partMax bytes each: `^[a-z]{1,64}\.[a-z]{1,64}$`
// is MustCompileParts(`^[a-z]+\.[a-z]+$`, ".", 64). expr must not let a
// part contain sep.
func MustCompileParts(expr, sep string, partMax int) *Matcher {
	return &Matcher{re: regexp.MustCompile(expr), sep: sep, partMax: partMax}
}

// MatchString reports whether s is within the limits and matches the
// expression.
func (m *Matcher) MatchString(s string) bool {
	if m.max > 0 && len(s) > m.max {
		return false
	}
	if m.partMax > 0 {
		for part := range strings.SplitSeq(s, m.sep) {
			if len(part) > m.partMax {
				return false
			}
		}
	}
	return m.re.MatchString(s)
}

// String describes the matcher for messages: the expression, then its
// limit.
func (m *Matcher) String() string {
	switch {
	case m.max > 0:
		return m.re.String() + " (at most " + strconv.Itoa(m.max) + " characters)"
	case m.partMax > 0:
		return m.re.String() + " (at most " + strconv.Itoa(m.partMax) + " characters between " + strings.TrimSpace(m.sep) + ")"
	}
	return m.re.String()
}
