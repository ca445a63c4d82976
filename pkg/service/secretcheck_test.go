package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// secretsConfig is a service configuration naming two references.
type secretsConfig struct {
	service.Common
	Secrets secrets.Config
	KeyRef  string `env:"KEY_REF"`
	HookRef string `env:"HOOK_REF"`
}

// secretsProgram checks its references with a real resolver (env: and
// file: backends), the way a service's hook does; keys must be at least
// 8 bytes (a use check), and references handed in under "refuse" are
// refused.
func secretsProgram(opened *int) service.Program[*secretsConfig] {
	return service.Program[*secretsConfig]{
		Name:      "demo",
		Summary:   "resolves demos",
		NewConfig: func() *secretsConfig { return &secretsConfig{Common: service.Common{AdminAddr: "127.0.0.1:9199"}} },
		Components: func(context.Context, *secretsConfig, service.Deps) ([]service.Component, error) {
			return nil, errors.New("not reached")
		},
		Secrets: func(ctx context.Context, cfg *secretsConfig, getenv func(string) string) service.SecretChecker {
			c := service.SecretChecker{Refs: []service.SecretRef{{Source: "KEY_REF", Ref: cfg.KeyRef}, {Source: "HOOK_REF", Ref: cfg.HookRef}}}
			res, err := secrets.Open(ctx, cfg.Secrets, secrets.Deps{Logger: zerolog.Nop(), Redactor: secrets.NewRedactor(),
				LookupEnv: func(k string) (string, bool) { v := getenv(k); return v, v != "" }})
			if err != nil {
				c.Err = err
				return c
			}
			*opened++
			c.Close = func() { _ = res.Close(); *opened-- }
			check := func(ctx context.Context, r service.SecretRef) error {
				v, err := res.Resolve(ctx, r.Ref)
				if err != nil {
					return err
				}
				defer v.Wipe()
				if v.Len() < 8 {
					return fmt.Errorf("%s: %w: %d bytes", r.Ref, service.ErrSecretUnusable, v.Len())
				}
				return nil
			}
			c.Check = check
			c.Extra = func(ctx context.Context, r service.SecretRef) error {
				if strings.HasPrefix(r.Source, "refuse") {
					return fmt.Errorf("%w: %s", service.ErrSecretRefused, r.Ref)
				}
				return check(ctx, r)
			}
			return c
		},
	}
}

// TestRunCheckSecrets: --check-secrets checks the configuration, then
// writes one JSON line per reference (the hook's, then those of
// --secret-refs) with the kind of each failure, never a value, and exits 1
// when one failed.
func TestRunCheckSecrets(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	const fileValue, envValue, shortValue = "canary-file-value-1", "canary-env-value-2", "canary"
	for name, v := range map[string]string{"hook": fileValue, "short": shortValue} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "DATABASE_URL": "postgres://u:pw@127.0.0.1:1/db",
		"SECRETS_FILE_ROOT": root, "AUTOPROV_SECRET_KEY": envValue}
	refs := filepath.Join(dir, "refs.jsonl")
	if err := os.WriteFile(refs, []byte(`{"source":"inventory hosts.yml:3 host a","ref":"file:hook"}
{"source":"refuse b","ref":"env:AUTOPROV_SECRET_KEY"}
{"source":"inventory hosts.yml:9 host c","ref":"file:short"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	badRefs := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(badRefs, []byte("not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type want struct{ source, kind string }
	tests := []struct {
		name     string
		set      map[string]string
		args     []string
		wantCode int
		want     []want
	}{
		{"all resolve", map[string]string{"KEY_REF": "env:AUTOPROV_SECRET_KEY", "HOOK_REF": "file:hook"}, nil, 0,
			[]want{{"KEY_REF", ""}, {"HOOK_REF", ""}}},
		{"not found and bad", map[string]string{"KEY_REF": "env:AUTOPROV_SECRET_NONE", "HOOK_REF": "file:../etc/passwd"}, nil, 1,
			[]want{{"KEY_REF", "not_found"}, {"HOOK_REF", "bad_ref"}}},
		{"disabled and unusable", map[string]string{"KEY_REF": "vault:secret/x#k", "HOOK_REF": "file:short"}, nil, 1,
			[]want{{"KEY_REF", "disabled"}, {"HOOK_REF", "unusable"}}},
		{"handed in", map[string]string{"KEY_REF": "env:AUTOPROV_SECRET_KEY", "HOOK_REF": "file:hook"}, []string{"--secret-refs", refs}, 1,
			[]want{{"KEY_REF", ""}, {"HOOK_REF", ""}, {"inventory hosts.yml:3 host a", ""}, {"refuse b", "refused"}, {"inventory hosts.yml:9 host c", "unusable"}}},
		{"backends fail to open", map[string]string{"KEY_REF": "env:AUTOPROV_SECRET_KEY", "HOOK_REF": "file:hook", "SECRETS_FILE_ROOT": filepath.Join(dir, "none")}, nil, 1,
			[]want{{"KEY_REF", "error"}, {"HOOK_REF", "error"}}},
		{"a bad refs file", map[string]string{"KEY_REF": "env:AUTOPROV_SECRET_KEY"}, []string{"--secret-refs", badRefs}, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			environ := map[string]string{}
			for k, v := range base {
				environ[k] = v
			}
			for k, v := range tt.set {
				environ[k] = v
			}
			opened := 0
			var stdout, stderr bytes.Buffer
			err := service.Run(context.Background(), secretsProgram(&opened), append([]string{"--check-secrets"}, tt.args...),
				func(k string) string { return environ[k] }, &stdout, &stderr)
			if got := service.ExitCode(err); got != tt.wantCode {
				t.Fatalf("exit %d (%v), want %d\n%s", got, err, tt.wantCode, stdout.String())
			}
			out := stdout.String() + stderr.String()
			if err != nil {
				out += err.Error()
			}
			for _, v := range []string{fileValue, envValue, shortValue} {
				if strings.Contains(out, v) {
					t.Errorf("output holds a secret value %q:\n%s", v, out)
				}
			}
			if opened != 0 {
				t.Errorf("the backends were not closed")
			}
			if tt.want == nil {
				return
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if lines[0] != "demo: configuration valid" || len(lines) != len(tt.want)+1 {
				t.Fatalf("stdout:\n%s", stdout.String())
			}
			for i, w := range tt.want {
				var res service.SecretResult
				if err := json.Unmarshal([]byte(lines[i+1]), &res); err != nil {
					t.Fatalf("line %d: %v: %s", i+2, err, lines[i+1])
				}
				if res.Source != w.source || res.Kind != w.kind || res.OK != (w.kind == "") || (res.Error == "") != res.OK {
					t.Errorf("line %d: %+v, want source %q kind %q", i+2, res, w.source, w.kind)
				}
			}
		})
	}
}

// TestSecretKind maps each failure to its name.
func TestSecretKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&secrets.Error{Kind: secrets.ErrNotFound}, "not_found"},
		{&secrets.Error{Kind: secrets.ErrPermission}, "permission"},
		{&secrets.Error{Kind: secrets.ErrUnavailable}, "unavailable"},
		{&secrets.Error{Kind: secrets.ErrBadRef}, "bad_ref"},
		{&secrets.Error{Kind: secrets.ErrDisabled}, "disabled"},
		{&secrets.Error{Kind: secrets.ErrTooLarge}, "too_large"},
		{fmt.Errorf("x: %w", service.ErrSecretRefused), "refused"},
		{fmt.Errorf("x: %w", service.ErrSecretUnusable), "unusable"},
		{errors.New("boom"), "error"},
	}
	for _, tt := range tests {
		if got := service.SecretKind(tt.err); got != tt.want {
			t.Errorf("SecretKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
