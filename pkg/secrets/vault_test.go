package secrets

import (
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	composedotenv "github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/vault-client-go"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

const (
	testRoleID   = "role-1f2e3d4c"
	testSecretID = "SECRETID-9a8b7c6d5e4f"
)

// vaultFixture is a stand-in Vault driven by a fake clock, a redactor, an
// event channel and a leak guard that scans every log line and error of the
// test for the canary, every token the stand-in issued and the secret_id.
type vaultFixture struct {
	srv    *vaulttest.Server
	clock  *clocktest.Fake
	red    *Redactor
	events chan VaultEvent
	guard  *leakGuard
}

func setupVault(t *testing.T, opts ...vaulttest.Option) *vaultFixture {
	t.Helper()
	clock := clocktest.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	srv := vaulttest.New(t, append([]vaulttest.Option{vaulttest.WithClock(clock)}, opts...)...)
	g := newLeakGuard(t)
	g.forbid(srv.IssuedTokens)
	g.forbid(func() []string { return []string{testSecretID, "SECRETID-rotated-0001"} })
	return &vaultFixture{
		srv:    srv,
		clock:  clock,
		red:    NewRedactor(),
		events: make(chan VaultEvent, 100),
		guard:  g,
	}
}

func (f *vaultFixture) appRoleConfig() VaultConfig {
	return VaultConfig{
		Addr:         f.srv.URL(),
		RoleID:       testRoleID,
		SecretID:     ValueFromString(testSecretID),
		AppRoleMount: "approle",
		Timeout:      5 * time.Second,
	}
}

func (f *vaultFixture) tokenConfig(tok string) VaultConfig {
	return VaultConfig{Addr: f.srv.URL(), Token: ValueFromString(tok), AppRoleMount: "approle", Timeout: 5 * time.Second}
}

func (f *vaultFixture) addRole(spec vaulttest.TokenSpec) {
	f.srv.AddAppRole("", "approle", vaulttest.AppRole{Name: "deployer", RoleID: testRoleID, SecretID: testSecretID, Token: spec})
}

func (f *vaultFixture) newVault(t *testing.T, cfg VaultConfig) (*Vault, error) {
	t.Helper()
	v, err := NewVault(testContext(t), cfg, VaultOptions{
		Logger:        f.guard.log,
		Clock:         f.clock,
		Redactor:      f.red,
		OnEvent:       func(ev VaultEvent) { f.events <- ev },
		RetryMax:      -1,
		RetryInterval: 5 * time.Second,
	})
	if err != nil {
		f.wait(t, VaultLoginFailed)
		return nil, f.guard.seen(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v, nil
}

func (f *vaultFixture) mustVault(t *testing.T, cfg VaultConfig) *Vault {
	t.Helper()
	v, err := f.newVault(t, cfg)
	if err != nil {
		t.Fatalf("NewVault: %v", err)
	}
	f.wait(t, VaultLoggedIn)
	return v
}

// wait returns the next token event, failing unless it is of kind k.
func (f *vaultFixture) wait(t *testing.T, k VaultEventKind) VaultEvent {
	t.Helper()
	select {
	case ev := <-f.events:
		if ev.Kind != k {
			t.Fatalf("event %v (err %v), want %v", ev.Kind, ev.Err, k)
		}
		if ev.Err != nil {
			f.guard.seen(ev.Err)
		}
		return ev
	case <-time.After(20 * time.Second):
		t.Fatalf("no %v event", k)
	}
	return VaultEvent{}
}

// tick waits until the renewal loop waits on the clock, then advances it.
func (f *vaultFixture) tick(t *testing.T, d time.Duration) {
	t.Helper()
	if err := f.clock.WaitForWaiters(testContext(t), 1); err != nil {
		t.Fatalf("renewal loop not waiting on the clock: %v", err)
	}
	f.clock.Advance(d)
}

func (f *vaultFixture) resolve(t *testing.T, v *Vault, ref string) (Value, error) {
	t.Helper()
	r, err := ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	val, err := v.Resolve(testContext(t), r)
	return val, f.guard.seen(err)
}

func (f *vaultFixture) mustResolve(t *testing.T, v *Vault, ref string) string {
	t.Helper()
	val, err := f.resolve(t, v, ref)
	if err != nil {
		t.Fatalf("resolve %s: %v", ref, err)
	}
	return val.Reveal()
}

func TestVaultTokenAuthReads(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{}) // never expires, like a root token
	f.srv.Put("", "secret", "app", map[string]any{"token": canary, "user": "deploy"})
	f.srv.Put("", "secret", "projects/a/b", map[string]any{"token": "nested-token-value"})
	f.srv.Put("", "secret", "versioned", map[string]any{"v": "one"})
	f.srv.Put("", "secret", "versioned", map[string]any{"v": "two"})
	f.srv.EnableKV("", "kv-prod")
	f.srv.Put("", "kv-prod", "db", map[string]any{"password": "prod-pass-123"})
	v := f.mustVault(t, f.tokenConfig(tok))
	if ttl, _ := v.TokenTTL(); ttl != 0 {
		t.Errorf("TTL = %v, want 0 (never expires)", ttl)
	}

	for ref, want := range map[string]string{
		"vault:secret/app#token":             canary,
		"vault:secret/app#user":              "deploy",
		"vault:secret/projects/a/b#token":    "nested-token-value",
		"vault:secret/versioned#v":           "two",
		"vault:secret/versioned?version=1#v": "one",
		"vault:secret/versioned?version=2#v": "two",
		"vault:kv-prod/db#password":          "prod-pass-123",
	} {
		if got := f.mustResolve(t, v, ref); got != want {
			t.Errorf("%s = %q, want %q", ref, got, want)
		}
	}
	if n := f.srv.Count(vaulttest.EndpointKVRead); n != 7 {
		t.Errorf("kv reads = %d, want 7", n)
	}

	for ref, kind := range map[string]error{
		"vault:secret/missing#token":          ErrNotFound,
		"vault:secret/app#missing":            ErrNotFound,
		"vault:secret/versioned?version=9#v":  ErrNotFound,
		"vault:nomount/app#token":             ErrNotFound,
		"vault:secret/projects/a#token":       ErrNotFound,
		"vault:secret/projects/a/b/c#token":   ErrNotFound,
		"vault:secret/projects%2Fa/b#token":   ErrBadRef, // refused before any request
		"vault:secret/../sys/mounts#anything": ErrBadRef,
	} {
		r, err := ParseRef(ref)
		if err != nil {
			f.guard.seen(err)
			if kind != ErrBadRef {
				t.Errorf("%s: %v", ref, err)
			}
			continue
		}
		_, err = v.Resolve(testContext(t), r)
		f.guard.seen(err)
		if !errors.Is(err, kind) {
			t.Errorf("%s: error %v, want kind %v", ref, err, kind)
		}
		if kind == ErrNotFound && strings.Contains(ref, "#token") && !strings.Contains(ref, "app#") {
			var ve *VaultError
			if !errors.As(err, &ve) || ve.Status != http.StatusNotFound {
				t.Errorf("%s: want a *VaultError with status 404, got %#v", ref, err)
			}
		}
	}
}

func TestVaultWholeSecretAsDotenv(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	data := map[string]any{
		"DB_PASSWORD": canary,
		"API_TOKEN":   "tok-$HOME-'quoted'",
		"MULTI":       pemSecret,
		"PORT":        5432,
		"DEBUG":       false,
		"EMPTY":       nil,
		"LIST":        []any{"a", 1},
	}
	f.srv.Put("", "secret", "projects/site/env", data)
	v := f.mustVault(t, f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{})))

	text := f.mustResolve(t, v, "vault:secret/projects/site/env")
	got, err := composedotenv.ParseWithLookup(strings.NewReader(text), noLookup)
	if err != nil {
		t.Fatalf("compose cannot parse the rendered secret: %v", err)
	}
	want := map[string]string{
		"DB_PASSWORD": canary,
		"API_TOKEN":   "tok-$HOME-'quoted'",
		"MULTI":       pemSecret,
		"PORT":        "5432",
		"DEBUG":       "false",
		"EMPTY":       "",
		"LIST":        `["a",1]`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dotenv read back (-want, +got):\n%s", diff)
	}
	prev := -1
	for _, k := range slices.Sorted(maps.Keys(want)) {
		i := strings.Index(text, k+"=")
		if i < prev || (i > 0 && text[i-1] != '\n') {
			t.Errorf("%s not on its own line in sorted order:\n%s", k, text)
		}
		prev = i
	}
	if !strings.Contains(text, "\nPORT='5432'\n") {
		t.Errorf("PORT not quoted:\n%s", text)
	}

	f.srv.Put("", "secret", "bad-keys", map[string]any{"not a name": "x"})
	_, err = f.resolve(t, v, "vault:secret/bad-keys")
	if !IsBadRef(err) {
		t.Errorf("invalid dotenv key: %v", err)
	}
}

func TestVaultPermissionDenied(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	f.srv.Put("", "secret", "allowed/app", map[string]any{"k": "allowed-value"})
	f.srv.Put("", "secret", "denied/app", map[string]any{"k": canary})
	f.addRole(vaulttest.TokenSpec{TTL: time.Hour, Renewable: true, ReadPaths: []string{"secret/data/allowed/*"}})
	v := f.mustVault(t, f.appRoleConfig())

	if got := f.mustResolve(t, v, "vault:secret/allowed/app#k"); got != "allowed-value" {
		t.Errorf("got %q", got)
	}
	_, err := f.resolve(t, v, "vault:secret/denied/app#k")
	if !errors.Is(err, ErrPermission) || IsUnavailable(err) || IsBadRef(err) {
		t.Fatalf("error %v, want ErrPermission", err)
	}
	var ve *VaultError
	if !errors.As(err, &ve) || ve.Status != http.StatusForbidden || len(ve.Errors) != 1 || !strings.Contains(ve.Errors[0], "permission denied") {
		t.Errorf("VaultError = %#v", ve)
	}
	// A policy denial is not an expired token: no second login.
	if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 1 {
		t.Errorf("logins = %d, want 1", n)
	}
}

func TestVaultBadCredentials(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Hour})

	_, err := f.newVault(t, f.tokenConfig("hvs.not-a-real-token-000000"))
	if !errors.Is(err, ErrPermission) {
		t.Errorf("unknown token: %v", err)
	}
	f.guard.forbid(func() []string { return []string{"hvs.not-a-real-token-000000"} })

	cfg := f.appRoleConfig()
	cfg.SecretID = ValueFromString("SECRETID-rotated-0001") // wrong
	_, err = f.newVault(t, cfg)
	if !errors.Is(err, ErrPermission) {
		t.Errorf("wrong secret_id: %v", err)
	}
	var ve *VaultError
	if !errors.As(err, &ve) || ve.Status != http.StatusBadRequest || ve.Errors[0] != "invalid role or secret ID" {
		t.Errorf("VaultError = %#v", ve)
	}

	cfg = f.appRoleConfig()
	cfg.AppRoleMount = "approle-other"
	_, err = f.newVault(t, cfg)
	if !errors.Is(err, ErrPermission) { // no such auth mount: Vault denies the unauthenticated request
		t.Errorf("wrong mount: %v", err)
	}
}

// vault-client-go's own error keeps the request with its token header: the
// reason this package never wraps it.
func TestVaultClientErrorHoldsTokenButOursDoesNot(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{})
	v := f.mustVault(t, f.tokenConfig(tok))

	_, raw := v.client.Read(testContext(t), "/secret/data/missing")
	var re *vault.ResponseError
	if !errors.As(raw, &re) || re.OriginalRequest.Header.Get("X-Vault-Token") != tok {
		t.Fatalf("expected vault-client-go to keep the token in its error, got %#v", raw)
	}
	ours := vaultFailure("read secret/data/missing", raw, false)
	f.guard.seen(ours)
	if errors.As(ours, &re) {
		t.Error("our error wraps vault.ResponseError")
	}
	if strings.Contains(ours.Error(), tok) || strings.Contains(strings.Join(strings.Fields(ours.Error()), ""), tok) {
		t.Error("our error holds the token")
	}
	if !errors.Is(ours, ErrNotFound) {
		t.Errorf("kind: %v", ours)
	}
}

func TestVaultAppRoleRenewsBeforeExpiry(t *testing.T) {
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Minute, MaxTTL: time.Hour, Renewable: true})
	f.srv.Put("", "secret", "app", map[string]any{"k": canary})
	v := f.mustVault(t, f.appRoleConfig())
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		f.tick(t, 30*time.Second) // half the TTL
		ev := f.wait(t, VaultRenewed)
		if ev.TTL != time.Minute {
			t.Errorf("renewal %d: TTL %v, want 1m", i, ev.TTL)
		}
		if n := f.srv.Count(vaulttest.EndpointRenewSelf); n != i {
			t.Errorf("renew-self calls = %d, want %d", n, i)
		}
	}
	// 90s have passed on a 60s token: only renewals kept it alive.
	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != canary {
		t.Errorf("got %q", got)
	}
	if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 1 {
		t.Errorf("logins = %d, want 1", n)
	}
	// The token is masked by the redactor.
	for _, tok := range f.srv.IssuedTokens() {
		if out := f.red.RedactString("X-Vault-Token: " + tok); strings.Contains(out, tok) {
			t.Error("token not registered with the redactor")
		}
	}
	v.Stop()
	v.Stop() // idempotent
}

func TestVaultReloginAfterRenewalFailure(t *testing.T) {
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Minute, MaxTTL: time.Hour, Renewable: true})
	f.srv.Put("", "secret", "app", map[string]any{"k": canary})
	v := f.mustVault(t, f.appRoleConfig())
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	first := f.srv.IssuedTokens()[0]
	f.srv.ExpireToken(first) // e.g. revoked by an operator

	f.tick(t, 30*time.Second)
	ev := f.wait(t, VaultRenewFailed)
	if !errors.Is(ev.Err, ErrPermission) {
		t.Errorf("renewal error %v, want ErrPermission", ev.Err)
	}
	f.wait(t, VaultLoggedIn)
	if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 2 {
		t.Errorf("logins = %d, want 2", n)
	}
	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != canary {
		t.Errorf("got %q", got)
	}
	// The new token is renewed in turn.
	f.tick(t, 30*time.Second)
	f.wait(t, VaultRenewed)
}

func TestVaultReloginWhenRenewalHitsMaxTTL(t *testing.T) {
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Minute, MaxTTL: 90 * time.Second, Renewable: true})
	v := f.mustVault(t, f.appRoleConfig())
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	f.tick(t, 30*time.Second) // t=30s: renewed up to the max (t=90s)
	if ev := f.wait(t, VaultRenewed); ev.TTL != time.Minute {
		t.Errorf("TTL %v, want 1m", ev.TTL)
	}
	f.tick(t, 30*time.Second) // t=60s: capped at 30s
	if ev := f.wait(t, VaultRenewed); ev.TTL != 30*time.Second {
		t.Errorf("TTL %v, want 30s (capped by max TTL)", ev.TTL)
	}
	f.tick(t, 15*time.Second) // t=75s: half the capped TTL: log in again
	f.wait(t, VaultLoggedIn)
	if n, m := f.srv.Count(vaulttest.EndpointRenewSelf), f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 2 || m != 2 {
		t.Errorf("renew-self = %d, logins = %d; want 2 and 2", n, m)
	}
	f.tick(t, 30*time.Second) // the new token is renewable again
	f.wait(t, VaultRenewed)
}

func TestVaultReloginWhenTokenNotRenewable(t *testing.T) {
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Minute, Renewable: false})
	v := f.mustVault(t, f.appRoleConfig())
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		f.tick(t, 30*time.Second)
		f.wait(t, VaultLoggedIn)
		if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != i {
			t.Errorf("logins = %d, want %d", n, i)
		}
	}
	if n := f.srv.Count(vaulttest.EndpointRenewSelf); n != 0 {
		t.Errorf("renew-self calls = %d for a non-renewable token", n)
	}
}

func TestVaultStaticTokenRenewalAndFailure(t *testing.T) {
	f := setupVault(t)
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Minute, Renewable: true})
	v := f.mustVault(t, f.tokenConfig(tok))
	if ttl, renewable := v.TokenTTL(); ttl != time.Minute || !renewable {
		t.Errorf("TokenTTL = %v, %v", ttl, renewable)
	}
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if err := v.Start(testContext(t)); err == nil {
		t.Error("second Start accepted")
	}
	f.tick(t, 30*time.Second)
	f.wait(t, VaultRenewed)

	// A static token cannot log in again: renewal failures are retried
	// (and reported) until the token expires.
	f.srv.ExpireToken(tok)
	f.tick(t, 30*time.Second)
	f.wait(t, VaultRenewFailed)
	f.tick(t, 5*time.Second)
	f.wait(t, VaultRenewFailed)
	if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 0 {
		t.Errorf("logins = %d", n)
	}
}

func TestVaultStaticTokenNotRenewableWarns(t *testing.T) {
	f := setupVault(t)
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Minute})
	f.mustVault(t, f.tokenConfig(tok))
	if !strings.Contains(f.guard.logs.String(), "not renewable") {
		t.Errorf("no warning about a non-renewable token in %s", f.guard.logs.String())
	}
}

func TestVaultReadReloginsWhenTokenExpired(t *testing.T) {
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Hour, Renewable: true})
	f.srv.Put("", "secret", "app", map[string]any{"k": canary})
	v := f.mustVault(t, f.appRoleConfig())
	f.srv.ExpireAllTokens() // e.g. the process was suspended past the TTL

	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != canary {
		t.Errorf("got %q", got)
	}
	f.wait(t, VaultLoggedIn)
	if n := f.srv.Count(vaulttest.EndpointAppRoleLogin); n != 2 {
		t.Errorf("logins = %d, want 2", n)
	}
}

func TestVaultTokenFileReread(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	f.srv.Put("", "secret", "app", map[string]any{"k": canary})
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	first := f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true})
	if err := os.WriteFile(file, []byte(first+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := VaultConfig{Addr: f.srv.URL(), TokenFile: file, AppRoleMount: "approle", Timeout: 5 * time.Second}
	v := f.mustVault(t, cfg)

	// An agent rotates the token in the file; the old one stops working.
	second := f.srv.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true})
	if err := os.WriteFile(file, []byte(second), 0o600); err != nil {
		t.Fatal(err)
	}
	f.srv.ExpireToken(first)
	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != canary {
		t.Errorf("got %q", got)
	}
	f.wait(t, VaultLoggedIn)
	if !f.srv.TokenValid(second) {
		t.Error("second token invalid")
	}
}

func TestVaultSecretIDFile(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	f.addRole(vaulttest.TokenSpec{TTL: time.Minute, Renewable: false})
	file := filepath.Join(t.TempDir(), "secret-id")
	if err := os.WriteFile(file, []byte(testSecretID+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := f.appRoleConfig()
	cfg.SecretID = Value{}
	cfg.SecretIDFile = file
	v := f.mustVault(t, cfg)
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	// The secret_id is rotated: the next login reads the new one.
	f.srv.AddAppRole("", "approle", vaulttest.AppRole{RoleID: testRoleID, SecretID: "SECRETID-rotated-0001",
		Token: vaulttest.TokenSpec{TTL: time.Minute}})
	if err := os.WriteFile(file, []byte("SECRETID-rotated-0001"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.tick(t, 30*time.Second)
	f.wait(t, VaultLoggedIn)
	if out := f.red.RedactString("sid=SECRETID-rotated-0001"); out != "sid="+Redacted {
		t.Errorf("secret_id not masked: %q", out)
	}
}

func TestVaultNamespace(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	f.srv.CreateNamespace("team-a")
	f.srv.Put("team-a", "secret", "app", map[string]any{"k": "team-a-value"})
	f.srv.Put("", "secret", "app", map[string]any{"k": "root-value"})
	nsTok := f.srv.CreateToken("team-a", vaulttest.TokenSpec{})
	cfg := f.tokenConfig(nsTok)
	cfg.Namespace = "team-a"
	v := f.mustVault(t, cfg)
	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != "team-a-value" {
		t.Errorf("got %q", got)
	}
	// A root-namespace token is not valid in team-a.
	cfg = f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{}))
	cfg.Namespace = "team-a"
	if _, err := f.newVault(t, cfg); !errors.Is(err, ErrPermission) {
		t.Errorf("root token in team-a: %v", err)
	}
}

func TestVaultUnavailable(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	v := f.mustVault(t, f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{})))
	f.srv.SetSealed(true)
	_, err := f.resolve(t, v, "vault:secret/app#k")
	if !IsUnavailable(err) || IsBadRef(err) {
		t.Errorf("sealed: %v", err)
	}
	var ve *VaultError
	if !errors.As(err, &ve) || ve.Status != http.StatusServiceUnavailable {
		t.Errorf("VaultError = %#v", ve)
	}

	cfg := f.tokenConfig("hvs.whatever-000000000000")
	cfg.Addr = "http://127.0.0.1:1"
	_, err = f.newVault(t, cfg)
	if !IsUnavailable(err) {
		t.Errorf("unreachable: %v", err)
	}
}

func TestVaultTLS(t *testing.T) {
	t.Parallel()
	f := setupVault(t, vaulttest.WithTLS())
	f.srv.Put("", "secret", "app", map[string]any{"k": canary})
	cfg := f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{}))
	if !strings.HasPrefix(cfg.Addr, "https://") {
		t.Fatalf("addr %s", cfg.Addr)
	}
	if _, err := f.newVault(t, cfg); !IsUnavailable(err) {
		t.Errorf("unknown CA: %v", err)
	}
	cfg.CACert = f.srv.CACertFile(t, t.TempDir())
	v := f.mustVault(t, cfg)
	if got := f.mustResolve(t, v, "vault:secret/app#k"); got != canary {
		t.Errorf("got %q", got)
	}
}

func TestVaultStopWithoutStart(t *testing.T) {
	t.Parallel()
	f := setupVault(t)
	v := f.mustVault(t, f.tokenConfig(f.srv.CreateToken("", vaulttest.TokenSpec{})))
	v.Stop()
	v.Stop()
	if err := v.Start(testContext(t)); err != nil {
		t.Fatal(err)
	}
	v.Stop()
	if err := v.Start(testContext(t)); err != nil {
		t.Fatalf("restart after Stop: %v", err)
	}
}
