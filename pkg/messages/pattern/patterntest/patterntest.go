// Package patterntest checks a pattern.Matcher against the bounded regular
// expression it stands for, on strings generated from that expression.
package patterntest

import (
	"math/rand/v2"
	"regexp"
	"regexp/syntax"
	"strings"
	"testing"
)

// Matcher is what is checked: pattern.Matcher, or anything that matches.
type Matcher interface {
	MatchString(s string) bool
}

// Same fails t when m and the regular expression original disagree on one
// of n strings generated from original: strings that match it, with each
// repetition taken from its minimum to one beyond its maximum, and the same
// strings with one character changed, added or removed.
func Same(t testing.TB, m Matcher, original string, n int) {
	t.Helper()
	re := regexp.MustCompile(original)
	tree, err := syntax.Parse(original, syntax.Perl)
	if err != nil {
		t.Fatalf("%s: %v", original, err)
	}
	rng := rand.New(rand.NewPCG(1, uint64(len(original))))
	alphabet := runesOf(tree)
	alphabet = append(alphabet, ' ', '\n', 'é', 0)
	var matched int
	for i := range n {
		var sb strings.Builder
		generate(&sb, tree, rng)
		s := sb.String()
		if i%2 == 1 && len(s) > 0 { // mutate
			r := []rune(s)
			at := rng.IntN(len(r))
			switch rng.IntN(3) {
			case 0:
				r[at] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				r = append(r[:at], append([]rune{alphabet[rng.IntN(len(alphabet))]}, r[at:]...)...)
			default:
				r = append(r[:at], r[at+1:]...)
			}
			s = string(r)
		}
		want := re.MatchString(s)
		if want {
			matched++
		}
		if got := m.MatchString(s); got != want {
			t.Fatalf("%q: matcher says %v, %s says %v", s, got, original, want)
		}
	}
	if matched == 0 || matched == n {
		t.Fatalf("%s: %d of %d generated strings matched: the check needs both kinds", original, matched, n)
	}
}

// generate writes a string the tree matches, except that a repetition
// may be taken once beyond its maximum.
func generate(sb *strings.Builder, re *syntax.Regexp, rng *rand.Rand) {
	switch re.Op {
	case syntax.OpLiteral:
		for _, r := range re.Rune {
			sb.WriteRune(r)
		}
	case syntax.OpCharClass:
		sb.WriteRune(pick(re.Rune, rng))
	case syntax.OpAnyCharNotNL, syntax.OpAnyChar:
		sb.WriteRune(rune('!' + rng.IntN(94)))
	case syntax.OpCapture:
		generate(sb, re.Sub[0], rng)
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			generate(sb, sub, rng)
		}
	case syntax.OpAlternate:
		generate(sb, re.Sub[rng.IntN(len(re.Sub))], rng)
	case syntax.OpQuest, syntax.OpStar, syntax.OpPlus, syntax.OpRepeat:
		lo, hi := 0, 4
		switch re.Op {
		case syntax.OpQuest:
			hi = 1
		case syntax.OpPlus:
			lo = 1
		case syntax.OpRepeat:
			lo, hi = re.Min, re.Max
			if hi < 0 {
				hi = lo + 4
			}
		}
		count := lo
		switch rng.IntN(4) { // the edges, one beyond, or anywhere between
		case 0:
		case 1:
			count = hi
		case 2:
			count = hi + 1
		default:
			count = lo + rng.IntN(hi-lo+1)
		}
		for range count {
			generate(sb, re.Sub[0], rng)
		}
	}
}

// pick returns a rune of the class given as ranges lo, hi, lo, hi, ...
func pick(ranges []rune, rng *rand.Rand) rune {
	if len(ranges) == 0 {
		return 'x'
	}
	i := 2 * rng.IntN(len(ranges)/2)
	lo, hi := ranges[i], ranges[i+1]
	if hi-lo > 200 {
		hi = lo + 200
	}
	return lo + rune(rng.IntN(int(hi-lo)+1))
}

// runesOf returns some runes of every class and literal of the tree.
func runesOf(re *syntax.Regexp) []rune {
	var out []rune
	switch re.Op {
	case syntax.OpLiteral:
		out = append(out, re.Rune...)
	case syntax.OpCharClass:
		for i := 0; i+1 < len(re.Rune); i += 2 {
			out = append(out, re.Rune[i], re.Rune[i+1])
			if re.Rune[i] > 0 {
				out = append(out, re.Rune[i]-1)
			}
			out = append(out, re.Rune[i+1]+1)
		}
	}
	for _, sub := range re.Sub {
		out = append(out, runesOf(sub)...)
	}
	return out
}

// Case is a matcher and the bounded regular expression it stands for.
type Case struct {
	Name     string
	M        Matcher
	Original string
}

// All checks each case with Same, as a subtest of its name.
func All(t *testing.T, cases []Case) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			Same(t, c.M, c.Original, 4000)
		})
	}
}
