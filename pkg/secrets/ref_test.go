package secrets

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRef(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want Ref
		str  string // canonical form when it differs from in
	}{
		{in: "vault:secret/app#token", want: Ref{Scheme: SchemeVault, Mount: "secret", Path: "app", Field: "token"}},
		{in: "vault:secret/projects/a/b#token", want: Ref{Scheme: SchemeVault, Mount: "secret", Path: "projects/a/b", Field: "token"}},
		{in: "vault:kv-prod/projects/a", want: Ref{Scheme: SchemeVault, Mount: "kv-prod", Path: "projects/a"}},
		{in: "vault:secret/app?version=3#db.password", want: Ref{Scheme: SchemeVault, Mount: "secret", Path: "app", Field: "db.password", Version: 3}},
		{in: "vault:secret/a_b/c-d/e.f@g+h=i,j:k~l", want: Ref{Scheme: SchemeVault, Mount: "secret", Path: "a_b/c-d/e.f@g+h=i,j:k~l"}},
		{in: "env:AUTOPROV_SECRET_DB", want: Ref{Scheme: SchemeEnv, Path: "AUTOPROV_SECRET_DB"}},
		{in: "env:_x1", want: Ref{Scheme: SchemeEnv, Path: "_x1"}},
		{in: "file:projects/a/.env", want: Ref{Scheme: SchemeFile, Path: "projects/a/.env"}},
		{in: "file:creds.json#api_key", want: Ref{Scheme: SchemeFile, Path: "creds.json", Field: "api_key"}},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRef(tc.in)
			if err != nil {
				t.Fatalf("ParseRef: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want, +got):\n%s", diff)
			}
			str := tc.str
			if str == "" {
				str = tc.in
			}
			if got.String() != str {
				t.Errorf("String() = %q, want %q", got.String(), str)
			}
			again, err := ParseRef(got.String())
			if err != nil || again != got {
				t.Errorf("String() does not parse back: %v %+v", err, again)
			}
		})
	}
}

func TestParseRefErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in, detail string
	}{
		{"", "empty reference"},
		{"secret/app#token", "no scheme"},
		{"http://x", "unknown scheme"},
		{"Vault:secret/app", "unknown scheme"},
		{"vault:", "want <mount>/<path>"},
		{"vault:secret", "want <mount>/<path>"},
		{"vault:secret/", "want <mount>/<path>"},
		{"vault:/app", "want <mount>/<path>"},
		{"vault:secret//app", "empty path segment"},
		{"vault:secret/app/", "empty path segment"},
		{"vault:secret/../sys/x", `"." or ".."`},
		{"vault:secret/./x", `"." or ".."`},
		{"vault:secret/a b", "not allowed in path segment"},
		{"vault:secret/a%2Fb", "not allowed in path segment"},
		{"vault:secret/a\\b", "not allowed in path segment"},
		{"vault:secret/app#", "empty #field"},
		{"vault:secret/app#a#b", "not allowed in #field"},
		{"vault:secret/app#a/b", "not allowed in #field"},
		{"vault:secret/app?version=0", "positive integer"},
		{"vault:secret/app?version=-1", "positive integer"},
		{"vault:secret/app?version=01", "positive integer"},
		{"vault:secret/app?v=1", `only the "version"`},
		{"env:", "variable name"},
		{"env:1ABC", "variable name"},
		{"env:A-B", "variable name"},
		{"env:AUTOPROV_SECRET_X#f", "no #field"},
		{"file:", "empty path"},
		{"file:/etc/passwd", "relative"},
		{"file:../etc/passwd", `"." or ".."`},
		{"file:a/../../b", `"." or ".."`},
		{"file:a\x00b", "not allowed"},
		{"vault:secret/\xff", "UTF-8"},
		{"vault:secret/" + strings.Repeat("a", MaxRefLength), "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			_, err := ParseRef(tc.in)
			if err == nil {
				t.Fatal("no error")
			}
			if !IsBadRef(err) || IsUnavailable(err) {
				t.Errorf("error kind: %v", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.Ref != "" {
				t.Errorf("want *Error without Ref, got %#v", err)
			}
			if !strings.Contains(err.Error(), tc.detail) {
				t.Errorf("error %q does not say %q", err, tc.detail)
			}
		})
	}
}

// A value pasted where a reference belongs must not come back in the error.
func TestParseRefErrorDoesNotEchoInput(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		canary,
		"vault:secret/" + canary,
		"env:" + canary,
		"file:" + canary,
		"vault:secret/app#" + canary,
	} {
		_, err := ParseRef(in)
		if err == nil {
			t.Fatalf("%q parsed", in)
		}
		if strings.Contains(err.Error(), "Kanar1e") {
			t.Errorf("error echoes input: %v", err)
		}
	}
}
