package secrets

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	composedotenv "github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/google/go-cmp/cmp"
	"github.com/joho/godotenv"
)

// noLookup keeps compose's parser from reading this process's environment.
func noLookup(string) (string, bool) { return "", false }

// johoLimitation reports the values joho/godotenv v1.5 cannot read back
// from any quoting (see RenderDotenv).
func johoLimitation(v string) bool {
	return dotenvStyleOf(v) == dotenvDouble &&
		(strings.HasSuffix(v, `\`) || strings.HasSuffix(v, `"`))
}

func roundTrip(t *testing.T, fields map[string]string) {
	t.Helper()
	text, err := RenderDotenv(fields)
	if err != nil {
		t.Fatalf("RenderDotenv: %v", err)
	}
	compose, err := composedotenv.ParseWithLookup(bytes.NewReader(text), noLookup)
	if err != nil {
		t.Fatalf("compose-go cannot parse %q: %v", text, err)
	}
	if diff := cmp.Diff(fields, compose); diff != "" {
		t.Errorf("compose-go read back (-want, +got):\n%s\ntext:\n%s", diff, text)
	}
	limited := false
	for _, v := range fields {
		limited = limited || johoLimitation(v)
	}
	joho, err := godotenv.UnmarshalBytes(text)
	if err != nil {
		if limited {
			return
		}
		t.Fatalf("godotenv cannot parse %q: %v", text, err)
	}
	for k, want := range fields {
		if johoLimitation(want) {
			continue
		}
		if got := joho[k]; got != want {
			t.Errorf("godotenv read %s back as %q, want %q\ntext:\n%s", k, got, want, text)
		}
	}
}

func TestRenderDotenvRoundTrip(t *testing.T) {
	t.Parallel()
	values := map[string]string{
		"PLAIN":          "abc123",
		"EMPTY":          "",
		"SPACES":         "  padded value  ",
		"DOLLAR":         "pa$$word $HOME ${HOME} $",
		"SINGLE_QUOTE":   "it's",
		"DOUBLE_QUOTE":   `say "hi"`,
		"BOTH_QUOTES":    `it's "x" ok`,
		"BACKSLASH":      `C:\path\to\n\t`,
		"TRAILING_BS":    `ends with \`,
		"QUOTE_BS":       `it's a \`,
		"BS_BEFORE_Q":    `a\'b`,
		"NEWLINES":       "line1\nline2\n\nline4\n",
		"CRLF":           "a\r\nb\r\n",
		"CR_AND_QUOTE":   "x'\ry",
		"HASH":           "value # not a comment",
		"EQUALS":         "a=b=c",
		"TAB":            "a\tb",
		"UNICODE":        "ünïcödé ✓ 秘密",
		"ESCAPES_IN_DQ":  `'\n\r\$\"\\\0123`,
		"DOLLAR_QUOTE":   `'$HOME'`,
		"PEM":            pemSecret,
		"JSON":           `{"a":"b","c":[1,2]}`,
		"LEADING_EQUALS": "=x",
		"ONLY_QUOTE":     "'",
		"ONLY_DQUOTE":    `"`,
		"BACKTICK":       "`echo hi`",
	}
	for k, v := range values {
		t.Run(k, func(t *testing.T) { roundTrip(t, map[string]string{k: v}) })
	}
	roundTrip(t, values)
	for k, v := range values {
		if johoLimitation(v) {
			t.Errorf("%s: godotenv cannot read %q back; the test should only hold values it can", k, v)
		}
	}

	text, _ := RenderDotenv(map[string]string{"B": "2", "A": "1", "C": "x'y"})
	if want := "A='1'\nB='2'\nC=x'y\n"; string(text) != want {
		t.Errorf("got %q, want %q", text, want)
	}
}

// Random values over the characters that matter to dotenv parsers.
func TestRenderDotenvRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	const alphabet = "ab $#'\"\\\n\r\t={}()`!~é"
	for i := range 3000 {
		b := make([]byte, rng.IntN(12))
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		v := strings.ToValidUTF8(string(b), "?")
		roundTrip(t, map[string]string{"K": v})
		if t.Failed() {
			t.Fatalf("iteration %d, value %q", i, v)
		}
	}
}

func TestRenderDotenvRejects(t *testing.T) {
	t.Parallel()
	for _, fields := range []map[string]string{
		{"1A": "x"},
		{"A-B": "x"},
		{"": "x"},
		{"A B": "x"},
		{"NUL": "a\x00b"},
	} {
		if _, err := RenderDotenv(fields); err == nil {
			t.Errorf("RenderDotenv(%q) accepted", fields)
		} else if strings.Contains(err.Error(), "a\x00b") {
			t.Errorf("error holds the value: %v", err)
		}
	}
}

func TestParseDotenvErrorHidesInput(t *testing.T) {
	t.Parallel()
	_, err := ParseDotenv([]byte("KEY=\"" + canary + "\nunterminated"))
	if err == nil {
		t.Fatal("parsed")
	}
	if strings.Contains(err.Error(), "Kanar1e") {
		t.Errorf("error holds the input: %v", err)
	}
}
