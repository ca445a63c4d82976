package secrets

import (
	"errors"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

// TestVaultWriteKV: a value written is read back through the reference
// returned (its version pinned), a path outside the token's write policy
// is refused by Vault, and one outside the client's allowed paths is
// refused before any request; the value is in no error.
func TestVaultWriteKV(t *testing.T) {
	f := setupVault(t)
	f.srv.EnableKV("", "secret")
	tok := f.srv.CreateToken("", vaulttest.TokenSpec{WritePaths: []string{"secret/data/projects/*"}})
	v, err := f.newVault(t, f.tokenConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	const value = "s3cr3t-CANARY-write-0001"
	ref, err := v.WriteKV(testContext(t), "secret", "projects/p1/credentials/db", map[string]Value{"value": ValueFromString(value)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ref.String(), "vault:secret/projects/p1/credentials/db?version=1#value"; got != want {
		t.Errorf("ref %q, want %q", got, want)
	}
	if strings.Contains(ref.String(), value) {
		t.Fatal("the reference holds the value")
	}
	got, err := v.Resolve(testContext(t), ref)
	if err != nil || got.Reveal() != value {
		t.Fatalf("read back: %v (value matches: %v)", err, got.Reveal() == value)
	}
	_, err = v.WriteKV(testContext(t), "secret", "infra/ssh", map[string]Value{"value": ValueFromString(value)})
	if !errors.Is(err, ErrPermission) || strings.Contains(err.Error(), value) {
		t.Errorf("write outside the policy: %v, want a permission error without the value", err)
	}
	before := f.srv.Count(vaulttest.EndpointKVWrite)
	v.allowed = []string{"secret/data/projects/*"}
	_, err = v.WriteKV(testContext(t), "secret", "other/x", map[string]Value{"value": ValueFromString(value)})
	if !errors.Is(err, ErrPermission) || f.srv.Count(vaulttest.EndpointKVWrite) != before {
		t.Errorf("write outside the allowed paths: %v, %d requests", err, f.srv.Count(vaulttest.EndpointKVWrite)-before)
	}
}
