//go:build docker

package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcvault "github.com/testcontainers/testcontainers-go/modules/vault"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

const (
	dockerVaultImage = "hashicorp/vault:1.17.6"
	dockerRootToken  = "root-token-for-tests"
	dockerRoleID     = "docker-role-id"
	dockerSecretID   = "docker-secret-id-0123456789"
)

// realVault starts Vault in dev mode with AppRole, a read policy and a few
// secrets, and returns its address.
func realVault(t *testing.T) string {
	t.Helper()
	ctx := testContext(t)
	c, err := tcvault.Run(ctx, dockerVaultImage,
		tcvault.WithToken(dockerRootToken),
		tcvault.WithInitCommand(
			"auth enable approle",
			`write sys/policies/acl/reader policy='path "secret/data/projects/*" { capabilities = ["read"] }'`,
			"write auth/approle/role/deployer token_ttl=4s token_max_ttl=7s token_policies=reader",
			"write auth/approle/role/deployer/role-id role_id="+dockerRoleID,
			"write auth/approle/role/deployer/custom-secret-id secret_id="+dockerSecretID,
			"kv put secret/projects/a/b token="+canary+" user=deploy",
			"kv put secret/private/x k=v",
		))
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("start Vault container: %v", err)
	}
	addr, err := c.HttpHostAddress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestDockerVaultBackend(t *testing.T) {
	addr := realVault(t)
	g := newLeakGuard(t)
	g.forbid(func() []string { return []string{dockerRootToken, dockerSecretID} })
	events := make(chan VaultEvent, 100)
	red := NewRedactor()
	open := func(cfg VaultConfig) *Vault {
		t.Helper()
		v, err := NewVault(testContext(t), cfg, VaultOptions{
			Logger: g.log, Redactor: red, RetryMax: -1,
			OnEvent: func(ev VaultEvent) { events <- ev },
		})
		if err != nil {
			t.Fatal(g.seen(err))
		}
		t.Cleanup(func() { _ = v.Close() })
		return v
	}
	resolve := func(v *Vault, ref string) (string, error) {
		r, err := ParseRef(ref)
		if err != nil {
			t.Fatal(err)
		}
		val, err := v.Resolve(testContext(t), r)
		return val.Reveal(), g.seen(err)
	}

	root := open(VaultConfig{Addr: addr, Token: ValueFromString(dockerRootToken), AppRoleMount: "approle", Timeout: 5 * time.Second})
	if got, err := resolve(root, "vault:secret/projects/a/b#token"); err != nil || got != canary {
		t.Fatalf("nested path: %q, %v", got, err)
	}
	env, err := resolve(root, "vault:secret/projects/a/b")
	if err != nil || !strings.Contains(env, "user='deploy'") {
		t.Errorf("dotenv: %v", err)
	}
	if _, err := resolve(root, "vault:secret/projects/missing#x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := resolve(root, "vault:nomount/x#y"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no mount: %v", err)
	}

	app := open(VaultConfig{Addr: addr, RoleID: dockerRoleID, SecretID: ValueFromString(dockerSecretID),
		AppRoleMount: "approle", Timeout: 5 * time.Second})
	if got, err := resolve(app, "vault:secret/projects/a/b#user"); err != nil || got != "deploy" {
		t.Errorf("approle read: %q, %v", got, err)
	}
	if _, err := resolve(app, "vault:secret/private/x#k"); !errors.Is(err, ErrPermission) {
		t.Errorf("policy denial: %v", err)
	}
	// Real time: renewal at ~2s, capped by the 7s max TTL, then a login.
	drain := func() {
		for len(events) > 0 {
			<-events
		}
	}
	drain()
	if err := app.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	seen := map[VaultEventKind]bool{}
	deadline := time.After(60 * time.Second)
	for !seen[VaultRenewed] || !seen[VaultLoggedIn] {
		select {
		case ev := <-events:
			g.seen(ev.Err)
			seen[ev.Kind] = true
		case <-deadline:
			t.Fatalf("events seen: %v", seen)
		}
	}
	if got, err := resolve(app, "vault:secret/projects/a/b#user"); err != nil || got != "deploy" {
		t.Errorf("read after renewals: %q, %v", got, err)
	}
}

// The stand-in answers with the same JSON shapes as a real Vault.
func TestDockerStandInMatchesVault(t *testing.T) {
	addr := realVault(t)
	srv := vaulttest.New(t)
	srv.Put("", "secret", "projects/a/b", map[string]any{"token": canary, "user": "deploy"})
	srv.AddAppRole("", "approle", vaulttest.AppRole{Name: "deployer", RoleID: dockerRoleID, SecretID: dockerSecretID,
		Token: vaulttest.TokenSpec{TTL: 4 * time.Second, MaxTTL: 7 * time.Second, Renewable: true,
			ReadPaths: []string{"secret/data/projects/*"}}})

	type exchange struct {
		status int
		body   map[string]any
	}
	call := func(base, method, path, token, body string) exchange {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("X-Vault-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: not JSON: %q", method, path, b)
		}
		return exchange{resp.StatusCode, m}
	}
	keys := func(v any) []string {
		m, _ := v.(map[string]any)
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	login := `{"role_id":"` + dockerRoleID + `","secret_id":"` + dockerSecretID + `"}`
	realLogin := call(addr, "POST", "/v1/auth/approle/login", "", login)
	fakeLogin := call(srv.URL(), "POST", "/v1/auth/approle/login", "", login)
	realTok := realLogin.body["auth"].(map[string]any)["client_token"].(string)
	fakeTok := fakeLogin.body["auth"].(map[string]any)["client_token"].(string)

	steps := []struct {
		name, method, path, body string
		token                    bool
		parts                    []string // nested objects whose keys must match
	}{
		{"login", "POST", "/v1/auth/approle/login", login, false, []string{"auth"}},
		{"lookup-self", "GET", "/v1/auth/token/lookup-self", "", true, []string{"data"}},
		{"renew-self", "POST", "/v1/auth/token/renew-self", `{"increment":"4s"}`, true, []string{"auth"}},
		{"kv read", "GET", "/v1/secret/data/projects/a/b", "", true, []string{"data"}},
		{"kv missing", "GET", "/v1/secret/data/projects/nope", "", true, nil},
		{"acl denied", "GET", "/v1/secret/data/private/x", "", true, nil},
		{"no token", "GET", "/v1/secret/data/projects/a/b", "", false, nil},
		{"bad secret id", "POST", "/v1/auth/approle/login", `{"role_id":"` + dockerRoleID + `","secret_id":"wrong"}`, false, nil},
	}
	for _, st := range steps {
		rt, ft := "", ""
		if st.token {
			rt, ft = realTok, fakeTok
		}
		r := call(addr, st.method, st.path, rt, st.body)
		f := call(srv.URL(), st.method, st.path, ft, st.body)
		if r.status != f.status {
			t.Errorf("%s: status %d (Vault) vs %d (stand-in)", st.name, r.status, f.status)
		}
		rk, fk := keys(r.body), keys(f.body)
		if !slices.Equal(rk, fk) {
			t.Errorf("%s: keys %v (Vault) vs %v (stand-in)", st.name, rk, fk)
		}
		for _, p := range st.parts {
			if rk, fk := keys(r.body[p]), keys(f.body[p]); !slices.Equal(rk, fk) {
				t.Errorf("%s.%s: keys %v (Vault) vs %v (stand-in)", st.name, p, rk, fk)
			}
		}
		if errs, ok := r.body["errors"]; ok {
			if rj, fj := mustJSON2(errs), mustJSON2(f.body["errors"]); rj != fj {
				t.Logf("%s: errors %s (Vault) vs %s (stand-in)", st.name, rj, fj)
			}
		}
	}
}

func mustJSON2(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
