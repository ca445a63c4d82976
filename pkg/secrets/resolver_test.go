package secrets

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

func TestResolverAllBackends(t *testing.T) {
	f := setupVault(t)
	f.srv.Put("", "secret", "projects/site", map[string]any{"DB_PASSWORD": canary, "API_KEY": "api-key-0123456789"})
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "creds.json"), []byte(`{"token":"file-token-abcdef","user":"u"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		EnvPrefix: DefaultEnvPrefix,
		FileRoot:  root,
		Vault:     f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true})),
	}
	before := os.Environ()
	environ := map[string]string{"AUTOPROV_SECRET_GIT": "ghp_envtoken123456", "VAULT_TOKEN": "hvs.from-env-000000"}
	res, err := Open(testContext(t), cfg, Deps{
		Logger:       f.guard.log,
		Redactor:     f.red,
		LookupEnv:    mapLookup(environ),
		Clock:        f.clock,
		OnVaultEvent: func(ev VaultEvent) { f.events <- ev },
	})
	if err != nil {
		t.Fatal(f.guard.seen(err))
	}
	t.Cleanup(func() { _ = res.Close() })
	f.wait(t, VaultLoggedIn)
	if err := res.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}

	run := f.red.Child() // one run
	rr := res.WithRedactor(run)
	for ref, want := range map[string]string{
		"env:AUTOPROV_SECRET_GIT":            "ghp_envtoken123456",
		"file:creds.json#token":              "file-token-abcdef",
		"vault:secret/projects/site#API_KEY": "api-key-0123456789",
	} {
		v, err := rr.Resolve(testContext(t), ref)
		if err != nil {
			t.Fatalf("%s: %v", ref, f.guard.seen(err))
		}
		if v.Reveal() != want {
			t.Errorf("%s = %q", ref, v.Reveal())
		}
		v.Wipe()
	}
	// Whole secret as dotenv: the text and each value are registered.
	env, err := rr.Resolve(testContext(t), "vault:secret/projects/site")
	if err != nil {
		t.Fatal(f.guard.seen(err))
	}
	out := run.RedactString("env file:\n" + env.Reveal() + "\npassword alone: " + canary +
		" b64: " + base64.StdEncoding.EncodeToString([]byte(canary)) + " git: ghp_envtoken123456 file-token-abcdef")
	for _, s := range []string{canary, "api-key-0123456789", "ghp_envtoken123456", "file-token-abcdef"} {
		if leaks(out, s) {
			t.Errorf("%q survived in %q", s, out)
		}
	}
	// The run's secrets are not the service's: the parent does not mask
	// them, and they are dropped with the run.
	if got := f.red.RedactString("ghp_envtoken123456"); got != "ghp_envtoken123456" {
		t.Errorf("parent masks the run's secret: %q", got)
	}
	run.Release()
	if got := run.RedactString("ghp_envtoken123456"); got != "ghp_envtoken123456" {
		t.Errorf("released run still masks: %q", got)
	}

	for ref, kind := range map[string]error{
		"env:VAULT_TOKEN":             ErrBadRef,
		"env:AUTOPROV_SECRET_NOPE":    ErrNotFound,
		"file:../etc/passwd":          ErrBadRef,
		"vault:secret/projects/nope":  ErrNotFound,
		"nonsense":                    ErrBadRef,
		"vault:secret/projects/site#": ErrBadRef,
	} {
		_, err := res.Resolve(testContext(t), ref)
		f.guard.seen(err)
		if !errors.Is(err, kind) {
			t.Errorf("%s: %v, want kind %v", ref, err, kind)
		}
	}
	if after := os.Environ(); !slices.Equal(before, after) {
		t.Error("the process environment changed")
	}
	f.guard.forbid(func() []string {
		return []string{"hvs.from-env-000000", "ghp_envtoken123456", "file-token-abcdef", "api-key-0123456789"}
	})
	res.Stop()
	res.Stop()
}

func TestResolverDisabledBackends(t *testing.T) {
	t.Parallel()
	g := newLeakGuard(t)
	red := NewRedactor()
	res, err := Open(testContext(t), Config{EnvPrefix: DefaultEnvPrefix}, Deps{Logger: g.log, Redactor: red})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	if res.Vault() != nil || res.Redactor() != red {
		t.Error("unexpected backends")
	}
	for _, ref := range []string{"env:AUTOPROV_SECRET_X", "file:x", "vault:secret/x#y"} {
		_, err := res.Resolve(testContext(t), ref)
		g.seen(err)
		if !errors.Is(err, ErrDisabled) || IsBadRef(err) || IsUnavailable(err) {
			t.Errorf("%s: %v, want ErrDisabled", ref, err)
		}
	}
	if err := res.Start(testContext(t)); err != nil {
		t.Error(err)
	}
	res.Stop()
}

func TestOpenRejectsBadConfig(t *testing.T) {
	t.Parallel()
	red := NewRedactor()
	for name, cfg := range map[string]Config{
		"no prefix":    {},
		"missing root": {EnvPrefix: DefaultEnvPrefix, FileRoot: filepath.Join(t.TempDir(), "missing")},
		"vault no auth": {EnvPrefix: DefaultEnvPrefix, Vault: VaultConfig{
			Addr: "https://v", Timeout: time.Second, AppRoleMount: "approle"}},
	} {
		if _, err := Open(testContext(t), cfg, Deps{Redactor: red}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Open(testContext(t), Config{EnvPrefix: DefaultEnvPrefix}, Deps{}); err == nil {
		t.Error("no redactor: accepted")
	}
	if _, err := NewResolver(ResolverOptions{}); err == nil {
		t.Error("NewResolver without redactor: accepted")
	}
}
