package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf16"
)

// MinSecretLength is the shortest secret, line of a multi-line secret or
// encoded form that a [Redactor] masks. Shorter strings would mask common
// words and numbers all over the output, so they are not registered.
const MinSecretLength = 4

// variants returns the byte strings to mask for secret: the secret itself,
// its base64 forms (standard and URL alphabets, for each of the three byte
// offsets at which it can sit in a longer base64-encoded stream), its URL
// escapes (see urlForms), its JSON string escapes (see jsonForms), each of
// these encoded twice, its Python reprs and the escaped forms of a
// multi-line secret whatever its line breaks (see escapedLineForms), and
// each line of a multi-line secret (raw, URL-, JSON- and repr-escaped).
// Duplicates and forms shorter than MinSecretLength are dropped.
func variants(secret []byte) [][]byte {
	seen := make(map[string]struct{})
	var out [][]byte
	add := func(b []byte) {
		if len(b) < MinSecretLength {
			return
		}
		if _, ok := seen[string(b)]; ok {
			return
		}
		seen[string(b)] = struct{}{}
		out = append(out, b)
	}
	addText := func(s []byte) {
		add(s)
		for _, u := range urlForms(s) {
			add(u)
		}
		for _, j := range jsonForms(s) {
			add(j)
		}
		for _, d := range doubleForms(s) {
			add(d)
		}
		for _, e := range escapedLineForms(s) {
			add(e)
		}
	}

	if len(secret) < MinSecretLength {
		return nil
	}
	addText(secret)
	for _, b := range base64Forms(secret) {
		add(b)
	}
	if t := bytes.TrimSpace(secret); len(t) != len(secret) {
		addText(t)
		for _, b := range base64Forms(t) {
			add(b)
		}
	}
	if bytes.ContainsAny(secret, "\r\n") {
		for line := range bytes.SplitSeq(secret, []byte("\n")) {
			line = bytes.TrimSuffix(line, []byte("\r"))
			addText(line)
			if t := bytes.TrimSpace(line); len(t) != len(line) {
				addText(t)
			}
		}
	}
	return out
}

// base64Forms returns the parts of secret's base64 encoding that appear in
// any base64 stream containing secret, whatever the stream's alignment:
// for each offset k in 0..2 the encoding of secret[k:], cut after the last
// character that does not depend on the bytes that follow. The same runs
// are prefixes of the padded and unpadded encodings alike.
func base64Forms(secret []byte) [][]byte {
	var out [][]byte
	for k := 0; k < 3 && k < len(secret); k++ {
		b := secret[k:]
		keep := len(b)/3*4 + len(b)%3
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			s := enc.EncodeToString(b)
			out = append(out, []byte(s[:keep]))
		}
	}
	return out
}

// urlForms returns s percent-encoded the ways clients write it: Go's
// url.QueryEscape (also Python's urllib.parse.quote_plus), url.PathEscape
// and userinfo (https://user:TOKEN@host); Python's urllib.parse.quote with
// its default safe="/" (Ansible's urlencode filter) and with safe=""; and
// each of them with lower-case hex digits (%2f), as some encoders write.
func urlForms(s []byte) [][]byte {
	forms := []string{
		url.QueryEscape(string(s)),
		url.PathEscape(string(s)),
		url.User(string(s)).String(),
		pyQuote(s, "/"),
		pyQuote(s, ""),
	}
	out := make([][]byte, 0, 2*len(forms))
	for _, f := range forms {
		out = append(out, []byte(f))
		if lower := lowerHexEscapes(f); lower != f {
			out = append(out, []byte(lower))
		}
	}
	return out
}

// pyQuote is Python's urllib.parse.quote(s, safe): every byte but ASCII
// letters, digits, "_.-~" and the safe ones becomes %XX (upper case).
func pyQuote(s []byte, safe string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for _, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			strings.IndexByte("_.-~", c) >= 0, strings.IndexByte(safe, c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// lowerHexEscapes writes the hex digits of every %XX escape in lower case.
func lowerHexEscapes(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			for j := i + 1; j <= i+2; j++ {
				if 'A' <= b[j] && b[j] <= 'F' {
					b[j] += 'a' - 'A'
				}
			}
			i += 2
		}
	}
	return string(b)
}

// jsonForms returns what JSON encoders write between the quotes for s:
// Go's json.Marshal with and without HTML escaping, Python's json.dumps
// with ensure_ascii (its default, and what Ansible's to_json writes: every
// non-ASCII character as \uXXXX) and without, the ASCII form with upper
// case hex digits, and the ASCII form with "/" escaped as "\/".
func jsonForms(s []byte) [][]byte {
	out := [][]byte{goJSON(s, true), goJSON(s, false)}
	ascii := pyJSON(s, true)
	out = append(out, ascii, pyJSON(s, false), upperUnicodeEscapes(ascii),
		bytes.ReplaceAll(ascii, []byte("/"), []byte(`\/`)))
	return out
}

// pyJSON is what Python's json.dumps writes between the quotes for s:
// \" \\ \n \r \t \b \f, \u00XX for other control characters and,
// with ascii (ensure_ascii), \uXXXX (surrogate pairs above U+FFFF) for
// everything outside space..~.
func pyJSON(s []byte, ascii bool) []byte {
	var b bytes.Buffer
	for _, r := range string(s) {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || ascii && r > 0x7e && r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			case ascii && r > 0xffff:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			default:
				b.WriteRune(r)
			}
		}
	}
	return b.Bytes()
}

// upperUnicodeEscapes writes the hex digits of every \uXXXX in upper case.
func upperUnicodeEscapes(j []byte) []byte {
	out := bytes.Clone(j)
	for i := 0; i+5 < len(out); i++ {
		if out[i] == '\\' && out[i+1] == 'u' {
			for k := i + 2; k < i+6; k++ {
				if 'a' <= out[k] && out[k] <= 'f' {
					out[k] -= 'a' - 'A'
				}
			}
			i += 5
		} else if out[i] == '\\' {
			i++ // an escaped character: skip it
		}
	}
	return out
}

// doubleForms returns s encoded twice by the same encoder: a URL inside a
// URL's query (QueryEscape, PathEscape, Python's quote with safe "" and
// "/"), and a JSON string holding JSON, as to_json of a to_json result or a
// module result quoted in a message (Go and Python, ASCII or not).
func doubleForms(s []byte) [][]byte {
	str := string(s)
	out := [][]byte{
		[]byte(url.QueryEscape(url.QueryEscape(str))),
		[]byte(url.PathEscape(url.PathEscape(str))),
		[]byte(pyQuote([]byte(pyQuote(s, "")), "")),
		[]byte(pyQuote([]byte(pyQuote(s, "/")), "/")),
		pyJSON(pyJSON(s, true), true),
		pyJSON(pyJSON(s, false), false),
	}
	for _, html := range []bool{true, false} {
		out = append(out, goJSON(goJSON(s, html), html))
	}
	return out
}

// goJSON is what json.Marshal writes between the quotes for s, with or
// without HTML escaping.
func goJSON(s []byte, html bool) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(html)
	if err := enc.Encode(string(s)); err != nil {
		return nil
	}
	j := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return j[1 : len(j)-1]
}

// escapedLineForms returns the forms of s that show its line breaks as
// escapes, so that a multi-line secret printed inside a JSON string or a
// Python repr is masked whole (short lines and the escapes between the
// lines included), not only line by line: Python's repr and ascii() of s
// (see pyRepr), each also inside a JSON string (a repr in a message that
// the callback prints as JSON); and, for a multi-line s, with its line
// breaks written the other way ("\n" and "\r\n"), its JSON and repr
// forms again, and its JSON forms with every line break as \u000a and
// \u000d (lower and upper case hex). Raw line breaks need no variant: the
// matcher skips them (see lineView).
func escapedLineForms(s []byte) [][]byte {
	var out [][]byte
	reprs := func(t []byte) {
		for _, r := range pyReprs(t) {
			out = append(out, r, pyJSON(r, true), pyJSON(r, false))
		}
	}
	reprs(s)
	if bytes.IndexByte(s, '\n') < 0 {
		return out
	}
	lines := bytes.Split(s, []byte("\n"))
	for i := range lines {
		lines[i] = bytes.TrimSuffix(lines[i], []byte("\r"))
	}
	for _, brk := range []string{"\n", "\r\n"} {
		t := bytes.Join(lines, []byte(brk))
		if !bytes.Equal(t, s) {
			out = append(out, jsonForms(t)...)
			reprs(t)
		}
		out = append(out, jsonUnicodeBreaks(t, "%04x"), jsonUnicodeBreaks(t, "%04X"))
	}
	return out
}

// jsonUnicodeBreaks is pyJSON's ASCII form of s with its line breaks
// written \uXXXX (hex in format) instead of \n and \r.
func jsonUnicodeBreaks(s []byte, format string) []byte {
	var b bytes.Buffer
	for _, r := range string(s) {
		if r == '\n' || r == '\r' {
			fmt.Fprintf(&b, `\u`+format, r)
			continue
		}
		b.Write(pyJSON([]byte(string(r)), true))
	}
	return b.Bytes()
}

// pyReprs returns what Python 3's repr() and ascii() write between the
// quotes for s, for both quote characters (repr quotes with ' and escapes
// it, unless s holds a ' and no "; the quote a secret inside a longer
// string gets depends on the rest): backslash, \t \n \r, \xNN for other
// control characters and DEL, non-printable characters as \xNN, \uNNNN or
// \UNNNNNNNN, and (ascii() only) every non-ASCII character so.
func pyReprs(s []byte) [][]byte {
	var out [][]byte
	for _, ascii := range []bool{false, true} {
		for _, escQuote := range []bool{true, false} {
			out = append(out, pyRepr(s, ascii, escQuote))
		}
	}
	return out
}

// pyRepr is one of the forms of pyReprs: escQuote escapes ', ascii writes
// non-ASCII characters as escapes.
func pyRepr(s []byte, ascii, escQuote bool) []byte {
	var b bytes.Buffer
	for _, r := range string(s) {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\'' && escQuote:
			b.WriteString(`\'`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x7f:
			b.WriteRune(r)
		case !ascii && unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.Bytes()
}
