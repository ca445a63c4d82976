package secrets

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// TestRedactEscapedLineBreaks: a multi-line secret shown with its line
// breaks escaped (inside a JSON string, a Python repr, a repr inside JSON;
// with \n, \r\n or \u000a whichever way it was registered) is masked whole,
// short lines and the escapes between the lines included; and one line of
// it in a repr is masked on its own.
func TestRedactEscapedLineBreaks(t *testing.T) {
	t.Parallel()
	// Quotes, a backslash, a control character, non-ASCII and a line shorter
	// than MinSecretLength: what makes repr, ascii() and JSON differ.
	const pw = "it's \"pw\"\\x\x01\npäss\nab1"
	crlfPEM := strings.ReplaceAll(pemSecret, "\n", "\r\n")
	// Each case: the secret, how it is shown, and the text around it (the
	// whole form, and nothing else, must become one Redacted, but for a
	// line break that ends it).
	cases := []struct {
		name, secret, form, around string
	}{
		{"json, \\n", pw, `it's \"pw\"\\x\u0001\npäss\nab1`, `{"pw": "%s"}`},
		{"json, \\r\\n for \\n", pw, `it's \"pw\"\\x\u0001\r\npäss\r\nab1`, `{"pw": "%s"}`},
		{"json ascii, \\u000a", pw, `it's \"pw\"\\x\u0001\u000ap\u00e4ss\u000aab1`, `{"pw": "%s"}`},
		{"json ascii, \\u000D\\u000A", pw, `it's \"pw\"\\x\u0001\u000D\u000Ap\u00e4ss\u000D\u000Aab1`, `{"pw": "%s"}`},
		{"python repr", pw, `it\'s "pw"\\x\x01\npäss\nab1`, `{'pw': '%s'}`},
		{"python ascii()", pw, `it\'s "pw"\\x\x01\np\xe4ss\nab1`, `{'pw': '%s'}`},
		{"python repr, \\r\\n", pw, `it\'s "pw"\\x\x01\r\npäss\r\nab1`, `['%s']`},
		{"repr inside json", pw, `it\\'s \"pw\"\\\\x\\x01\\npäss\\nab1`, `{"msg": "got {'pw': '%s'}"}`},
		{"key, json", pemSecret, jsonBody(pemSecret), `{"key": "%s"}`},
		{"key, json \\r\\n for \\n", pemSecret, jsonBody(crlfPEM), `{"key": "%s"}`},
		{"key, json \\n for \\r\\n", crlfPEM, jsonBody(pemSecret), `{"key": "%s"}`},
		{"key, json \\u000a", pemSecret, strings.ReplaceAll(jsonBody(pemSecret), `\n`, `\u000a`), `{"key": "%s"}`},
		{"key, repr", pemSecret, strings.ReplaceAll(pemSecret, "\n", `\n`), `{'key': '%s'}`},
		{"key without its final break, json \\r\\n", pemSecret, jsonBody(strings.TrimSuffix(crlfPEM, "\r\n")), `{"key": "%s"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRedactor()
			r.AddString(tc.secret)
			in := fmt.Sprintf(tc.around, tc.form)
			// A break that ends the secret is no part of it: it may stay.
			end := ""
			for _, e := range []string{`\r\n`, `\n`, `\u000a`} {
				if strings.HasSuffix(tc.form, e) {
					end = e
					break
				}
			}
			want := fmt.Sprintf(tc.around, Redacted+end)
			if out := r.RedactString(in); out != want {
				t.Errorf("\n in   %q\n out  %q\n want %q", in, out, want)
			}
		})
	}

	// One line of the secret alone, in a repr, is masked by itself.
	r := NewRedactor()
	r.AddString(pw)
	if out := r.RedactString(`line: 'it\'s "pw"\\x\x01' ok`); out != `line: '`+Redacted+`' ok` {
		t.Errorf("one line in a repr: %q", out)
	}
}

// TestPyReprMatchesPython checks pyRepr against the real repr() and
// ascii() of Python 3.
func TestPyReprMatchesPython(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is missing (make test installs it): %v", err)
	}
	for _, s := range []string{"it's \"pw\"\\x\x01\npäss\tab1\x7f\u00a0\u200b😀\r", `only 'single'`, `only "double"`} {
		for _, fn := range []string{"repr", "ascii"} {
			cmd := exec.Command(py, "-c", "import sys; sys.stdout.write("+fn+"(sys.stdin.read()))")
			cmd.Stdin = strings.NewReader(s)
			b, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			got := string(b)
			quoted := false
			for _, f := range pyReprs([]byte(s)) {
				quoted = quoted || got == "'"+string(f)+"'" || got == `"`+string(f)+`"`
			}
			if !quoted {
				t.Errorf("%s(%q) = %s: not among %q", fn, s, got, pyReprs([]byte(s)))
			}
		}
	}
}

// jsonBody is s JSON-encoded, without the quotes.
func jsonBody(s string) string { return strings.Trim(mustJSON(s), `"`) }

// TestRedactSecretSplitByEscapedBreak: a one-line secret a play printed in
// two parts with an escaped line break between them (a JSON string, a
// repr, JSON inside JSON) is masked, the break with it.
func TestRedactSecretSplitByEscapedBreak(t *testing.T) {
	t.Parallel()
	const secret = "SPLITTOKEN-0123456789"
	for _, tc := range []struct{ name, in string }{
		{"json \\n", `{"msg": "SPLIT\nTOKEN-0123456789"}`},
		{"json \\r\\n and an indent", `{"msg": "SPLIT\r\n    TOKEN-0123456789"}`},
		{"json \\u000a", `{"msg": "SPLIT\u000aTOKEN-0123456789"}`},
		{"json in json", `{"msg": "{\"out\": \"SPLIT\\nTOKEN-0123456789\"}"}`},
		{"raw break", "SPLIT\nTOKEN-0123456789"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRedactor()
			r.AddString(secret)
			out := r.RedactString(tc.in)
			if strings.Contains(out, "TOKEN-0123456789") || !strings.Contains(out, Redacted) {
				t.Errorf("%q redacted to %q", tc.in, out)
			}
		})
	}
}
