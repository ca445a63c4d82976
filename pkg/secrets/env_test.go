package secrets

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestEnvBackend(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"AUTOPROV_SECRET_DB":    canary,
		"AUTOPROV_SECRET_EMPTY": "",
		"VAULT_TOKEN":           "hvs.must-never-be-read",
		"DATABASE_URL":          "postgres://u:p@h/db",
	}
	b, err := NewEnvBackend(DefaultEnvPrefix, mapLookup(env))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ref  string
		kind error
	}{
		{"env:AUTOPROV_SECRET_DB", nil},
		{"env:AUTOPROV_SECRET_MISSING", ErrNotFound},
		{"env:AUTOPROV_SECRET_EMPTY", ErrNotFound},
		{"env:AUTOPROV_SECRET_", ErrBadRef},
		{"env:VAULT_TOKEN", ErrBadRef},
		{"env:DATABASE_URL", ErrBadRef},
		{"env:autoprov_secret_DB", ErrBadRef},
	}
	for _, tc := range cases {
		t.Run(tc.ref, func(t *testing.T) {
			ref, err := ParseRef(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			v, err := b.Resolve(context.Background(), ref)
			if tc.kind == nil {
				if err != nil || v.Reveal() != canary {
					t.Fatalf("Resolve = %v", err)
				}
				return
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("error %v, want kind %v", err, tc.kind)
			}
			if !v.IsZero() {
				t.Error("value returned with an error")
			}
			for _, secret := range []string{"hvs.must-never-be-read", "postgres://", "Kanar1e"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q holds a value", err)
				}
			}
		})
	}
}

func TestEnvPrefixValidation(t *testing.T) {
	t.Parallel()
	lookup := mapLookup(nil)
	for _, p := range []string{"", "A_", "AUTO", "VAULT_", "V_", "VAULT_X_", "SECRETS_", "DATABASE_", "RE_", "1ABC_", "AB-C_"} {
		if _, err := NewEnvBackend(p, lookup); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	for _, p := range []string{DefaultEnvPrefix, "APP_SECRET_", "X_PROJ_"} {
		if _, err := NewEnvBackend(p, lookup); err != nil {
			t.Errorf("prefix %q refused: %v", p, err)
		}
	}
	if _, err := NewEnvBackend(DefaultEnvPrefix, nil); err == nil {
		t.Error("nil lookup accepted")
	}
}
