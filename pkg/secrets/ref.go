package secrets

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Scheme names the backend of a reference.
type Scheme string

// The backends.
const (
	SchemeVault Scheme = "vault"
	SchemeEnv   Scheme = "env"
	SchemeFile  Scheme = "file"
)

// MaxRefLength is the longest reference ParseRef accepts, in bytes.
const MaxRefLength = 1024

// Ref is a parsed secret reference. It names a secret; it never holds one.
type Ref struct {
	Scheme Scheme
	// Mount is the Vault KV v2 mount (the first path segment); vault only.
	Mount string
	// Path is the secret path under the mount (vault), the variable name
	// (env), or the file path relative to the file root (file).
	Path string
	// Field selects one field of the secret (vault, file); empty for the
	// whole secret.
	Field string
	// Version is the KV v2 version to read (vault); 0 for the latest.
	Version int
}

// String returns the reference in its canonical form, for example
// "vault:secret/projects/a?version=2#token". It contains no value.
func (r Ref) String() string {
	var b strings.Builder
	b.WriteString(string(r.Scheme))
	b.WriteByte(':')
	if r.Scheme == SchemeVault {
		b.WriteString(r.Mount)
		b.WriteByte('/')
	}
	b.WriteString(r.Path)
	if r.Version > 0 {
		b.WriteString("?version=")
		b.WriteString(strconv.Itoa(r.Version))
	}
	if r.Field != "" {
		b.WriteByte('#')
		b.WriteString(r.Field)
	}
	return b.String()
}

// ParseRef parses and validates a secret reference:
//
//	vault:<mount>/<path>[?version=<n>][#<field>]
//	env:<NAME>
//	file:<relative/path>[#<field>]
//
// Path segments and fields use letters, digits and . _ ~ @ + = , : -;
// segments are never empty, "." or "..". Variable names match
// [A-Za-z_][A-Za-z0-9_]*. Errors wrap [ErrBadRef] and never repeat the
// input (in case a value was pasted where a reference belongs).
func ParseRef(s string) (Ref, error) {
	if s == "" {
		return Ref{}, badRef("empty reference")
	}
	if len(s) > MaxRefLength {
		return Ref{}, badRef("reference longer than %d bytes", MaxRefLength)
	}
	if !utf8.ValidString(s) {
		return Ref{}, badRef("reference is not valid UTF-8")
	}
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Ref{}, badRef(`no scheme (want "vault:", "env:" or "file:")`)
	}
	var ref Ref
	var err *Error
	switch Scheme(scheme) {
	case SchemeVault:
		ref, err = parseVault(rest)
	case SchemeEnv:
		ref, err = parseEnv(rest)
	case SchemeFile:
		ref, err = parseFile(rest)
	default:
		return Ref{}, badRef(`unknown scheme (want "vault:", "env:" or "file:")`)
	}
	if err != nil {
		err.Detail = scheme + " reference: " + err.Detail
		return Ref{}, err
	}
	return ref, nil
}

func parseVault(rest string) (Ref, *Error) {
	ref := Ref{Scheme: SchemeVault}
	rest, field, err := cutField(rest)
	if err != nil {
		return Ref{}, err
	}
	ref.Field = field
	if p, query, ok := strings.Cut(rest, "?"); ok {
		rest = p
		name, val, _ := strings.Cut(query, "=")
		if name != "version" {
			return Ref{}, badRef(`only the "version" query parameter is allowed`)
		}
		n, convErr := strconv.Atoi(val)
		if convErr != nil || n < 1 || val != strconv.Itoa(n) {
			return Ref{}, badRef("version must be a positive integer")
		}
		ref.Version = n
	}
	mount, path, ok := strings.Cut(rest, "/")
	if !ok || mount == "" || path == "" {
		return Ref{}, badRef("want <mount>/<path>")
	}
	if err := checkSegments(mount); err != nil {
		return Ref{}, err
	}
	if err := checkSegments(path); err != nil {
		return Ref{}, err
	}
	ref.Mount, ref.Path = mount, path
	return ref, nil
}

func parseEnv(rest string) (Ref, *Error) {
	if strings.Contains(rest, "#") {
		return Ref{}, badRef("env references take no #field")
	}
	if !validEnvName(rest) {
		return Ref{}, badRef("variable name must match [A-Za-z_][A-Za-z0-9_]*")
	}
	return Ref{Scheme: SchemeEnv, Path: rest}, nil
}

func parseFile(rest string) (Ref, *Error) {
	rest, field, err := cutField(rest)
	if err != nil {
		return Ref{}, err
	}
	if rest == "" {
		return Ref{}, badRef("empty path")
	}
	if strings.HasPrefix(rest, "/") {
		return Ref{}, badRef("path must be relative to the file root")
	}
	if err := checkSegments(rest); err != nil {
		return Ref{}, err
	}
	return Ref{Scheme: SchemeFile, Path: rest, Field: field}, nil
}

// cutField splits "<rest>#<field>" and validates the field.
func cutField(s string) (string, string, *Error) {
	rest, field, ok := strings.Cut(s, "#")
	if !ok {
		return s, "", nil
	}
	if field == "" {
		return "", "", badRef("empty #field")
	}
	for i := 0; i < len(field); i++ {
		if !refChar(field[i]) {
			return "", "", badRef("character not allowed in #field at byte %d", i)
		}
	}
	return rest, field, nil
}

// checkSegments validates a slash-separated path.
func checkSegments(p string) *Error {
	for seg := range strings.SplitSeq(p, "/") {
		switch seg {
		case "":
			return badRef("empty path segment")
		case ".", "..":
			return badRef(`path segment "." or ".." not allowed`)
		}
		for i := 0; i < len(seg); i++ {
			if !refChar(seg[i]) {
				return badRef("character not allowed in path segment")
			}
		}
	}
	return nil
}

// refChar reports whether c may appear in a path segment or field.
func refChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("._~@+=,:-", c) >= 0
}

// validEnvName reports whether s is a portable environment variable name.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
