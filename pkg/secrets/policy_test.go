package secrets

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

// policyReadPaths reads the KV paths a shipped Vault policy (deploy/vault)
// grants "read" on, leaving out the token's own auth/token paths.
func policyReadPaths(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/vault/" + name)
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)path\s+"([^"]+)"\s*\{\s*capabilities\s*=\s*\[([^\]]*)\]\s*\}`)
	var paths []string
	for _, m := range block.FindAllStringSubmatch(string(data), -1) {
		if strings.HasPrefix(m[1], "auth/token/") {
			continue
		}
		if !strings.Contains(m[2], `"read"`) {
			t.Fatalf("%s: path %s without read: %s", name, m[1], m[2])
		}
		if caps := strings.Fields(strings.NewReplacer(`"`, " ", ",", " ").Replace(m[2])); !slices.Equal(caps, []string{"read"}) {
			t.Fatalf("%s: path %s grants more than read: %v", name, m[1], caps)
		}
		paths = append(paths, m[1])
	}
	if len(paths) == 0 {
		t.Fatalf("%s: no paths found: the test no longer reads the policy", name)
	}
	return paths
}

// TestShippedPoliciesAreSeparate: the project policy is what the project
// resolver allows by default, and no path of the service's own SSH keys is
// readable under it.
func TestShippedPoliciesAreSeparate(t *testing.T) {
	t.Parallel()
	projects := policyReadPaths(t, "infra-projects.hcl")
	ssh := policyReadPaths(t, "infra-ssh.hcl")
	if !slices.Equal(projects, []string{DefaultProjectVaultPaths}) {
		t.Fatalf("infra-projects.hcl reads %v, PROJECT_VAULT_ALLOWED_PATHS defaults to %s", projects, DefaultProjectVaultPaths)
	}
	for _, p := range []string{"secret/data/infra/ssh", "secret/data/infra/ssh/web-1", "secret/data/infra/vault", "kv-admin/data/root"} {
		if PathAllowed(projects, p) {
			t.Errorf("the project policy covers the service's %s", p)
		}
	}
	for _, p := range []string{"secret/data/projects/9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f/app"} {
		if PathAllowed(ssh, p) {
			t.Errorf("the SSH policy covers the project path %s", p)
		}
		if !PathAllowed(projects, p) {
			t.Errorf("the project policy does not cover %s", p)
		}
	}
}

// TestProjectReferenceOutsidePolicyFailsBeforeAnyRequest: with the shipped
// project policy on the stand-in's token, a reference a request might send
// to reach the service's SSH key, another mount or Vault's own paths fails
// with ErrPermission and no request reaches Vault at all; a project path is
// read.
func TestProjectReferenceOutsidePolicyFailsBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	projects := policyReadPaths(t, "infra-projects.hcl")
	f.srv.EnableKV("", "kv-admin")
	f.srv.Put("", "secret", "infra/ssh", map[string]any{"private_key": "-----BEGIN OPENSSH PRIVATE KEY----- fleet"})
	f.srv.Put("", "kv-admin", "root", map[string]any{"password": "admin-password-000"})
	const project = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	f.srv.Put("", "secret", "projects/"+project+"/app", map[string]any{"DB_PASSWORD": canary})
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true, ReadPaths: projects})

	res, err := OpenProject(testContext(t), ProjectConfig{Vault: f.tokenConfig(tok), VaultPaths: projects}, Config{EnvPrefix: DefaultEnvPrefix},
		Deps{Logger: f.guard.log, Redactor: f.red, Clock: f.clock, OnVaultEvent: func(ev VaultEvent) { f.events <- ev }})
	if err != nil {
		t.Fatal(f.guard.seen(err))
	}
	t.Cleanup(func() { _ = res.Close() })
	f.wait(t, VaultLoggedIn)

	total := func() int {
		n := 0
		for _, e := range []vaulttest.Endpoint{vaulttest.EndpointKVRead, vaulttest.EndpointLookupSelf, vaulttest.EndpointRenewSelf,
			vaulttest.EndpointAppRoleLogin, vaulttest.EndpointOther} {
			n += f.srv.Count(e)
		}
		return n
	}
	before := total()
	for _, ref := range []string{
		"vault:secret/infra/ssh#private_key",
		"vault:secret/infra/ssh",
		"vault:kv-admin/root#password",
		"vault:secret/projects#x",
		"vault:secret/projectsX/" + project + "#x",
		"vault:sys/policy#x",
		"vault:cubbyhole/x#y",
	} {
		v, err := res.Resolve(testContext(t), ref)
		if !errors.Is(err, ErrPermission) || !v.IsZero() {
			t.Errorf("%s: value %v, err %v; want ErrPermission", ref, !v.IsZero(), f.guard.seen(err))
		}
		if n := total(); n != before {
			t.Fatalf("%s: %d requests reached Vault; want none", ref, n-before)
		}
	}
	// Env and file references are off unless configured for projects.
	for _, ref := range []string{"env:AUTOPROV_SECRET_SSH", "file:ssh/id_ed25519"} {
		if _, err := res.Resolve(testContext(t), ref); !errors.Is(err, ErrDisabled) {
			t.Errorf("%s: err = %v, want ErrDisabled", ref, err)
		}
	}
	v, err := res.Resolve(testContext(t), "vault:secret/projects/"+project+"/app#DB_PASSWORD")
	if err != nil || v.Reveal() != canary {
		t.Fatalf("project secret: %v", f.guard.seen(err))
	}
	if f.srv.Count(vaulttest.EndpointKVRead) != 1 {
		t.Fatalf("kv reads = %d, want 1", f.srv.Count(vaulttest.EndpointKVRead))
	}
}

// TestProjectConfigMustBeSeparate: the project backends may not share the
// service's Vault login, file root or env prefix.
func TestProjectConfigMustBeSeparate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	own := Config{EnvPrefix: DefaultEnvPrefix, FileRoot: dir,
		Vault: VaultConfig{Addr: "https://vault:8200", Token: ValueFromString("hvs.own-token"), AppRoleMount: "approle", Timeout: time.Second}}
	for name, pc := range map[string]ProjectConfig{
		"same token":           {VaultPaths: []string{DefaultProjectVaultPaths}, Vault: own.Vault},
		"same file root":       {FileRoot: dir},
		"file root inside":     {FileRoot: dir + "/projects"},
		"file root around":     {FileRoot: "/"},
		"env prefix inside":    {EnvPrefix: DefaultEnvPrefix + "PROJECT_"},
		"env prefix around":    {EnvPrefix: "AUTOPROV_"},
		"env prefix sensitive": {EnvPrefix: "TIME4VPS_"},
		"no allowed paths":     {Vault: VaultConfig{Addr: "https://vault:8200", Token: ValueFromString("hvs.other"), Timeout: time.Second}},
	} {
		if err := errors.Join(pc.Validate(), pc.Separate(own)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := ProjectConfig{EnvPrefix: "AUTOPROV_PROJECT_", FileRoot: t.TempDir(), VaultPaths: []string{DefaultProjectVaultPaths},
		Vault: VaultConfig{Addr: "https://vault:8200", Token: ValueFromString("hvs.project"), AppRoleMount: "approle", Timeout: time.Second}}
	if err := errors.Join(ok.Validate(), ok.Separate(own)); err != nil {
		t.Errorf("separate config refused: %v", err)
	}
}

// TestEnvReferencesCannotReachServiceVariables: no prefix can be chosen
// that exposes a variable the service reads, and such a variable is never
// resolved even when it carries the prefix.
func TestEnvReferencesCannotReachServiceVariables(t *testing.T) {
	t.Parallel()
	lookup := mapLookup(map[string]string{"AUTOPROV_SECRET_X": "x-value-1234", "APP_DB_URL": "postgres://u:p@h/d"})
	for _, p := range []string{"TIME4VPS_", "REDIS_", "PG", "PGX_", "DATABASE_", "PROJECT_VAULT_", "PROJECT_"} {
		if _, err := NewEnvBackend(p, lookup); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	// The service says which variables it reads: a prefix reaching one is
	// refused, and so is the variable itself.
	if _, err := NewEnvBackend("APP_", lookup, "APP_DB_URL"); err == nil {
		t.Error("prefix reaching a configuration variable accepted")
	}
	b, err := NewEnvBackend(DefaultEnvPrefix, lookup, "AUTOPROV_SECRET_X")
	if err == nil {
		t.Fatalf("prefix reaching AUTOPROV_SECRET_X accepted: %v", b)
	}
}

func TestPathAllowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, path string
		want          bool
	}{
		{"secret/data/projects/*", "secret/data/projects/a/app", true},
		{"secret/data/projects/*", "secret/data/projects/a", true},
		{"secret/data/projects/*", "secret/data/projects", false},
		{"secret/data/projects/*", "secret/data/projectsX/a", false},
		{"secret/data/projects/*", "secret/data/infra/ssh", false},
		{"secret/data/pro*", "secret/data/projects/a", true},
		{"secret/data/infra/ssh", "secret/data/infra/ssh", true},
		{"secret/data/infra/ssh", "secret/data/infra/ssh/x", false},
		{"secret/data/projects/+/app", "secret/data/projects/p1/app", true},
		{"secret/data/projects/+/app", "secret/data/projects/p1/other", false},
		{"secret/data/projects/+/app", "secret/data/projects/p1/x/app", false},
		{"secret/data/+/*", "secret/data/a/b", true},
		{"secret/data/+/*", "secret/data/a", false},
	} {
		if got := PathAllowed([]string{tc.pattern}, tc.path); got != tc.want {
			t.Errorf("PathAllowed(%q, %q) = %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
	for _, bad := range []string{"", "/secret/data/x", "secret/*/x", "secret/data/*x*"} {
		if checkPolicyPath(bad) == nil {
			t.Errorf("policy path %q accepted", bad)
		}
	}
}
