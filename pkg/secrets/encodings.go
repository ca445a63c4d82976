package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
)

// MinSecretLength is the shortest secret, line of a multi-line secret or
// encoded form that a [Redactor] masks. Shorter strings would mask common
// words and numbers all over the output, so they are not registered.
const MinSecretLength = 4

// variants returns the byte strings to mask for secret: the secret itself,
// its base64 forms (standard and URL alphabets, for each of the three byte
// offsets at which it can sit in a longer base64-encoded stream), its URL
// query, path and userinfo escapes, its JSON string escapes, and each line of a
// multi-line secret (raw, URL- and JSON-escaped). Duplicates and forms
// shorter than MinSecretLength are dropped.
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
		add([]byte(url.QueryEscape(string(s))))
		add([]byte(url.PathEscape(string(s))))
		add([]byte(url.User(string(s)).String())) // userinfo (https://user:TOKEN@host)
		for _, j := range jsonEscapes(s) {
			add(j)
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

// jsonEscapes returns what json.Marshal writes between the quotes for s,
// with and without HTML escaping of <, > and &.
func jsonEscapes(s []byte) [][]byte {
	var out [][]byte
	for _, html := range []bool{true, false} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(html)
		if err := enc.Encode(string(s)); err != nil {
			continue
		}
		j := strings.TrimSuffix(buf.String(), "\n")
		out = append(out, []byte(j[1:len(j)-1]))
	}
	return out
}
