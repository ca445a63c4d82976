package secrets

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
)

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("VAULT_ADDR", "https://vault.example:8200")
	t.Setenv("VAULT_ROLE_ID", "role")
	t.Setenv("VAULT_SECRET_ID", canary)
	t.Setenv("SECRETS_FILE_ROOT", "/run/secrets")
	var cfg Config
	if err := env.Parse(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.EnvPrefix != DefaultEnvPrefix || cfg.Vault.AppRoleMount != "approle" || cfg.Vault.Timeout != 10*time.Second {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if cfg.Vault.SecretID.Reveal() != canary || cfg.Vault.RoleID != "role" || cfg.FileRoot != "/run/secrets" {
		t.Errorf("values not read: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// The secret_id is gone from the environment, so no child inherits it.
	if _, ok := os.LookupEnv("VAULT_SECRET_ID"); ok {
		t.Error("VAULT_SECRET_ID still in the environment")
	}
	if _, ok := os.LookupEnv("VAULT_ROLE_ID"); !ok {
		t.Error("VAULT_ROLE_ID was removed too")
	}
	// Printing the configuration masks the secrets.
	for _, verb := range []string{"%v", "%+v", "%#v"} {
		if out := fmt.Sprintf(verb, cfg); strings.Contains(out, "Kanar1e") {
			t.Errorf("config printed a secret: %s", out)
		}
	}
}

func TestConfigTags(t *testing.T) {
	t.Parallel()
	want := map[string]bool{
		"VAULT_ADDR": true, "VAULT_TOKEN": true, "VAULT_TOKEN_FILE": true, "VAULT_ROLE_ID": true,
		"VAULT_SECRET_ID": true, "VAULT_SECRET_ID_FILE": true, "VAULT_APPROLE_MOUNT": true,
		"VAULT_NAMESPACE": true, "VAULT_CACERT": true, "VAULT_TIMEOUT": true,
		"SECRETS_ENV_PREFIX": true, "SECRETS_FILE_ROOT": true, "VAULT_ALLOWED_PATHS": true,
	}
	seen := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Tag.Get("env") == "" {
				walk(f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			if name == "" {
				t.Errorf("field %s has no env tag", f.Name)
			}
			if f.Tag.Get("desc") == "" {
				t.Errorf("field %s (%s) has no desc tag", f.Name, name)
			}
			seen[name] = true
		}
	}
	walk(reflect.TypeFor[Config]())
	for n := range want {
		if !seen[n] {
			t.Errorf("no field for %s", n)
		}
	}
	for n := range seen {
		if !want[n] {
			t.Errorf("unexpected variable %s", n)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	valid := func() Config {
		return Config{EnvPrefix: DefaultEnvPrefix, Vault: VaultConfig{AppRoleMount: "approle", Timeout: time.Second}}
	}
	tok := ValueFromString("hvs.x")
	cases := []struct {
		name   string
		modify func(*Config)
		errs   []string // substrings; empty: valid
	}{
		{"no vault", func(*Config) {}, nil},
		{"token", func(c *Config) { c.Vault.Addr = "https://v:8200"; c.Vault.Token = tok }, nil},
		{"token file", func(c *Config) { c.Vault.Addr = "http://v:8200"; c.Vault.TokenFile = "/run/t" }, nil},
		{"approle", func(c *Config) { c.Vault.Addr = "https://v"; c.Vault.RoleID = "r"; c.Vault.SecretIDFile = "/run/s" }, nil},
		{"file root", func(c *Config) { c.FileRoot = "/srv/secrets" }, nil},
		{"relative file root", func(c *Config) { c.FileRoot = "secrets" }, []string{"SECRETS_FILE_ROOT"}},
		{"empty prefix", func(c *Config) { c.EnvPrefix = "" }, []string{"SECRETS_ENV_PREFIX"}},
		{"prefix reaching VAULT_TOKEN", func(c *Config) { c.EnvPrefix = "VAULT_" }, []string{"SECRETS_ENV_PREFIX"}},
		{"credentials without addr", func(c *Config) { c.Vault.Token = tok }, []string{"VAULT_ADDR"}},
		{"addr without credentials", func(c *Config) { c.Vault.Addr = "https://v" }, []string{"no credentials"}},
		{"two methods", func(c *Config) {
			c.Vault.Addr = "https://v"
			c.Vault.Token = tok
			c.Vault.RoleID = "r"
			c.Vault.SecretIDFile = "/s"
		}, []string{"only one"}},
		{"token and file", func(c *Config) { c.Vault.Addr = "https://v"; c.Vault.Token = tok; c.Vault.TokenFile = "/t" }, []string{"only one"}},
		{"role without secret", func(c *Config) { c.Vault.Addr = "https://v"; c.Vault.RoleID = "r" }, []string{"VAULT_SECRET_ID or VAULT_SECRET_ID_FILE"}},
		{"secret without role", func(c *Config) { c.Vault.Addr = "https://v"; c.Vault.SecretID = tok }, []string{"VAULT_ROLE_ID"}},
		{"secret and secret file", func(c *Config) {
			c.Vault.Addr = "https://v"
			c.Vault.RoleID = "r"
			c.Vault.SecretID = tok
			c.Vault.SecretIDFile = "/s"
		}, []string{"set only one"}},
		{"bad mount", func(c *Config) {
			c.Vault.Addr = "https://v"
			c.Vault.RoleID = "r"
			c.Vault.SecretID = tok
			c.Vault.AppRoleMount = "a/../b"
		}, []string{"VAULT_APPROLE_MOUNT"}},
		{"bad scheme", func(c *Config) { c.Vault.Addr = "ftp://v"; c.Vault.Token = tok }, []string{"scheme"}},
		{"credentials in addr", func(c *Config) { c.Vault.Addr = "https://u:p@v"; c.Vault.Token = tok }, []string{"credentials"}},
		{"no host", func(c *Config) { c.Vault.Addr = "https://"; c.Vault.Token = tok }, []string{"no host"}},
		{"zero timeout", func(c *Config) { c.Vault.Addr = "https://v"; c.Vault.Token = tok; c.Vault.Timeout = 0 }, []string{"VAULT_TIMEOUT"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.modify(&c)
			err := c.Validate()
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted")
			}
			for _, s := range tc.errs {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "hvs.x") {
				t.Errorf("error holds the token: %v", err)
			}
		})
	}
}
