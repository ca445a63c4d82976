package secrets

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// gapSecrets hold what makes encoders differ: / + ? & = < > " \ space,
// non-ASCII, a character outside the BMP and a control character.
var gapSecrets = []string{
	canary,
	"tok/en+with space&x=ü😀\x01end",
	"ghp_16C7e42F292c6912E7710c838347Ae178B4a", // plain: every encoder leaves it alone
}

// pythonForms encodes secret with the real Python encoders a play meets:
// urllib.parse's quote forms, Jinja's urlencode filter, json.dumps with
// and without ensure_ascii, Ansible's to_json and to_nice_json, and each
// applied twice. It returns name -> encoded text.
func pythonForms(t *testing.T, secret string) map[string]string {
	t.Helper()
	const script = `
import json, sys, urllib.parse
import jinja2.filters
from ansible.plugins.filter.core import to_json, to_nice_json
s = sys.stdin.read()
q = urllib.parse.quote
forms = {
    "quote": q(s),
    "quote safe=''": q(s, safe=""),
    "quote_plus": urllib.parse.quote_plus(s),
    "quote twice": q(q(s, safe=""), safe=""),
    "jinja urlencode": jinja2.filters.do_urlencode(s),
    "json.dumps": json.dumps(s),
    "json.dumps ensure_ascii=False": json.dumps(s, ensure_ascii=False),
    "json.dumps twice": json.dumps(json.dumps(s)),
    "json in json": json.dumps({"msg": json.dumps({"password": s})}),
    "ansible to_json": to_json({"password": s}),
    "ansible to_nice_json": to_nice_json({"password": s}),
    "ansible to_json twice": to_json(to_json(s)),
}
json.dump(forms, sys.stdout)
`
	cmd := exec.Command("/usr/bin/python3", "-c", script)
	cmd.Dir = os.TempDir() // not the repository: its ansible/ would shadow the package
	cmd.Stdin = strings.NewReader(secret)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python encoders (Debian's python3 with ansible-core, installed by make test): %v\n%s", err, stderr.String())
	}
	var forms map[string]string
	if err := json.Unmarshal(out, &forms); err != nil {
		t.Fatal(err)
	}
	return forms
}

// decodings returns text and what every decoder a reader might apply makes
// of it: URL and JSON unescaping, once and twice, and lines joined.
func decodings(text string) []string {
	out := []string{text}
	for range 2 {
		for _, s := range out {
			if u, err := url.QueryUnescape(s); err == nil {
				out = append(out, u)
			}
			if u, err := url.PathUnescape(s); err == nil {
				out = append(out, u)
			}
			out = append(out, jsonUnescape(s))
		}
	}
	for _, s := range out {
		out = append(out, string(newLineView([]byte(s)).text))
	}
	return out
}

func recoverable(out, secret string) bool {
	for _, d := range decodings(out) {
		if strings.Contains(d, secret) {
			return true
		}
	}
	return false
}

// TestRedactPythonAndAnsibleEncodings: the URL-encoded (Python's quote
// forms, Jinja's urlencode), ASCII-escaped JSON (json.dumps, Ansible's
// to_json) and double-encoded forms of a secret, written by the real
// Python and Ansible code, are masked.
func TestRedactPythonAndAnsibleEncodings(t *testing.T) {
	t.Parallel()
	for _, secret := range gapSecrets {
		r := NewRedactor()
		r.AddString(secret)
		for name, form := range pythonForms(t, secret) {
			in := "task said: " + form + " (end)"
			if !recoverable(in, secret) {
				t.Fatalf("%s: the test cannot find the secret in its own input %q", name, in)
			}
			out := r.RedactString(in)
			if recoverable(out, secret) || !strings.Contains(out, Redacted) {
				t.Errorf("%s of %.8q: secret recoverable from %q", name, secret, out)
			}
		}
	}
}

// TestRedactLineSplitSecrets: a secret broken over lines (wrapped at any
// column, with or without indentation, with \n or \r\n) is masked whole,
// and so is a multi-line secret printed with other indentation.
func TestRedactLineSplitSecrets(t *testing.T) {
	t.Parallel()
	secret := "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
	r := NewRedactor()
	r.AddString(secret)
	for width := 1; width < len(secret); width++ {
		for _, brk := range []string{"\n", "\r\n", "\n    ", "\n\t"} {
			var parts []string
			for i := 0; i < len(secret); i += width {
				parts = append(parts, secret[i:min(i+width, len(secret))])
			}
			in := "token: " + strings.Join(parts, brk) + "\nnext line"
			out := r.RedactString(in)
			if recoverable(out, secret) {
				t.Fatalf("wrapped at %d with %q: secret recoverable from %q", width, brk, out)
			}
			if !strings.HasPrefix(out, "token: "+Redacted) || !strings.HasSuffix(out, "\nnext line") {
				t.Fatalf("wrapped at %d with %q: surrounding text damaged: %q", width, brk, out)
			}
		}
	}
	// The lines of a key, re-indented as YAML output does.
	k := NewRedactor()
	k.AddString(pemSecret)
	lines := strings.Split(strings.TrimSuffix(pemSecret, "\n"), "\n")
	in := "key: |\n      " + strings.Join(lines, "\n      ") + "\nok"
	out := k.RedactString(in)
	for _, l := range lines {
		if len(l) >= MinSecretLength && strings.Contains(out, l) {
			t.Errorf("line %q survived in %q", l, out)
		}
	}
}

// TestRedactTruncatedEdges: a text cut by a producer that knows no secrets
// (the callback plugin shortening a message) may end with the start of a
// secret or begin with its end; RedactTruncated masks those pieces too, so
// that no part of a secret straddling the cut survives.
func TestRedactTruncatedEdges(t *testing.T) {
	t.Parallel()
	secret := "s3cr3t-T0ken-9f8e7d6c5b4a"
	r := NewRedactor()
	r.AddString(secret)
	text := strings.Repeat("x", 100) + " token=" + secret + " more output"
	at := strings.Index(text, secret)
	for cut := at + 1; cut < at+len(secret); cut++ {
		head := r.RedactTruncated(text[:cut], false, true)
		if strings.Contains(head, secret[:cut-at]) {
			t.Fatalf("cut at %d: the secret's start %q survived in %q", cut, secret[:cut-at], head)
		}
		if !strings.HasPrefix(head, strings.Repeat("x", 100)+" token=") {
			t.Fatalf("cut at %d: text before the secret damaged: %q", cut, head)
		}
		tail := r.RedactTruncated(text[cut:], true, false)
		if strings.Contains(tail, secret[cut-at:]) {
			t.Fatalf("cut at %d: the secret's end %q survived in %q", cut, secret[cut-at:], tail)
		}
		if !strings.HasSuffix(tail, " more output") {
			t.Fatalf("cut at %d: text after the secret damaged: %q", cut, tail)
		}
		// Without the cut flags the pieces stay: the flags matter.
		if cut-at >= 6 && !strings.Contains(r.RedactString(text[:cut]), secret[:cut-at]) {
			t.Fatalf("cut at %d: RedactString masked a piece it cannot know", cut)
		}
	}
	// A cut that splits no secret leaves the text as it is.
	if got := r.RedactTruncated("plain text, nothing secret here", true, true); got != "plain text, nothing secret here" {
		t.Errorf("clean text changed: %q", got)
	}
}

// TestWriterLineSplitAcrossWrites: a secret split by a line break and cut
// across writes at every position is masked.
func TestWriterLineSplitAcrossWrites(t *testing.T) {
	t.Parallel()
	secret := "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
	r := NewRedactor()
	r.AddString(secret)
	text := "clone with " + secret[:17] + "\n   " + secret[17:] + "\nfatal: done\n"
	for cut := 0; cut <= len(text); cut++ {
		var out bytes.Buffer
		w := r.NewWriter(&out)
		_, _ = w.Write([]byte(text[:cut]))
		_, _ = w.Write([]byte(text[cut:]))
		_ = w.Close()
		if recoverable(out.String(), secret) || strings.Contains(out.String(), secret[:17]) || strings.Contains(out.String(), secret[17:]) {
			t.Fatalf("split at %d: %q", cut, out.String())
		}
		if !strings.HasPrefix(out.String(), "clone with "+Redacted) || !strings.HasSuffix(out.String(), "\nfatal: done\n") {
			t.Fatalf("split at %d: damaged: %q", cut, out.String())
		}
	}
}
