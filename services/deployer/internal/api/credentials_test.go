package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// credentialCanary is a credential's value: it must never come back in an
// answer, a stored row or a log line.
const credentialCanary = "CANARY-cred-value-7f3a9c"

// TestCredentials: a key manages its project's credentials (a reference,
// or a value written to Vault under the project's path of which only the
// reference is kept); another project's credential answers as an unknown
// one; a project the key lacks is 403; references outside the project's
// templates and malformed names are 422 naming the field; without the
// scope, 403. The value is in no answer, row or log line.
func TestCredentials(t *testing.T) {
	t.Parallel()
	vault, env := credentialsVault(t)
	e := dt.Start(t, dt.Options{Env: env})
	manage := []auth.Scope{auth.ScopeCredentialsWrite}
	keyA, keyB := e.Key("cred-a", manage, dt.Project), e.Key("cred-b", manage, projectB)
	jobsOnly := e.Key("jobs-only", []auth.Scope{auth.ScopeJobsWrite}, dt.Project)

	refA := "vault:secret/projects/" + dt.Project + "/ssh#private_key"
	resp, body := e.Do("POST", "/api/v1/credentials", keyA, map[string]any{"name": "prod-ssh", "ref": refA})
	if resp.StatusCode != 201 {
		t.Fatalf("create by reference: %d %s", resp.StatusCode, body)
	}
	c := dt.JSON[credentials.Credential](t, body)
	if c.ProjectID != dt.Project || c.Ref != refA || c.VaultWritten {
		t.Errorf("created %+v", c)
	}
	resp, body = e.Do("POST", "/api/v1/credentials", keyA, map[string]any{"project_id": dt.Project, "name": "db", "value": credentialCanary})
	if resp.StatusCode != 201 || strings.Contains(string(body), credentialCanary) {
		t.Fatalf("create with a value: %d %s", resp.StatusCode, body)
	}
	c = dt.JSON[credentials.Credential](t, body)
	path := "projects/" + dt.Project + "/credentials/db"
	if want := "vault:secret/" + path + "?version=1#value"; c.Ref != want || !c.VaultWritten {
		t.Errorf("value written as %+v, want the reference %s", c, want)
	}
	if got := vault.Get("", "secret", path); got["value"] != credentialCanary {
		t.Errorf("Vault holds %d fields at %s, not the value", len(got), path)
	}
	resp, body = e.Do("POST", "/api/v1/credentials", keyB, map[string]any{"name": "db", "ref": "vault:secret/projects/" + projectB + "/db"})
	if resp.StatusCode != 201 {
		t.Fatalf("B's credential: %d %s", resp.StatusCode, body)
	}

	t.Run("list sees only the key's project", func(t *testing.T) {
		resp, body := e.Do("GET", "/api/v1/credentials", keyA, nil)
		list := dt.JSON[api.CredentialList](t, body)
		if resp.StatusCode != 200 || len(list.Items) != 2 || strings.Contains(string(body), projectB) {
			t.Errorf("A's list: %d %s", resp.StatusCode, body)
		}
		dt.CheckSchema(t, "CredentialList", body)
		resp, body = e.Do("GET", "/api/v1/credentials?project_id="+projectB, keyA, nil)
		if resp.StatusCode != 403 {
			t.Errorf("A lists B's project: %d %s", resp.StatusCode, body)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			key    string
			body   map[string]any
			status int
			field  string
		}{
			{"another project", keyA, map[string]any{"project_id": projectB, "name": "x", "ref": refA}, 403, "project_id"},
			{"reference of another project", keyA, map[string]any{"name": "x", "ref": "vault:secret/projects/" + projectB + "/ssh"}, 422, "ref"},
			{"not a reference", keyA, map[string]any{"name": "x", "ref": credentialCanary}, 422, "ref"},
			{"bad name", keyA, map[string]any{"name": "../x", "ref": refA}, 422, "name"},
			{"both ref and value", keyA, map[string]any{"name": "x", "ref": refA, "value": credentialCanary}, 422, "value"},
			{"name taken", keyA, map[string]any{"name": "db", "value": credentialCanary}, 409, "name"},
			{"without the scope", jobsOnly, map[string]any{"name": "x", "ref": refA}, 403, ""},
		} {
			resp, body := e.Do("POST", "/api/v1/credentials", tc.key, tc.body)
			p := dt.JSON[api.Problem](t, body)
			if resp.StatusCode != tc.status || (tc.field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != tc.field)) {
				t.Errorf("%s: %d %s, want %d naming %q", tc.name, resp.StatusCode, body, tc.status, tc.field)
			}
			if strings.Contains(string(body), credentialCanary) {
				t.Errorf("%s: the answer repeats the value", tc.name)
			}
		}
	})
	t.Run("delete", func(t *testing.T) {
		resp, body := e.Do("DELETE", "/api/v1/credentials/db?project_id="+dt.Project, keyB, nil)
		if resp.StatusCode != 403 {
			t.Errorf("B deletes in A's project: %d %s", resp.StatusCode, body)
		}
		resp, body = e.Do("DELETE", "/api/v1/credentials/prod-ssh", keyB, nil)
		uresp, ubody := e.Do("DELETE", "/api/v1/credentials/never-made", keyB, nil)
		if resp.StatusCode != 404 || uresp.StatusCode != 404 || problemShape(t, body) != problemShape(t, ubody) {
			t.Errorf("B deletes A's credential name: %d %s; an unknown one: %d %s", resp.StatusCode, body, uresp.StatusCode, ubody)
		}
		resp, body = e.Do("DELETE", "/api/v1/credentials/prod-ssh", keyA, nil)
		if resp.StatusCode != 204 {
			t.Errorf("A deletes its own: %d %s", resp.StatusCode, body)
		}
		_, body = e.Do("GET", "/api/v1/credentials", keyA, nil)
		if list := dt.JSON[api.CredentialList](t, body); len(list.Items) != 1 || list.Items[0].Name != "db" {
			t.Errorf("after delete: %s", body)
		}
	})

	var rows string
	if err := e.DB.QueryRow(context.Background(), `SELECT coalesce(string_agg(c::text, ' '), '') FROM credentials c`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rows, credentialCanary) {
		t.Error("a stored credential holds the value")
	}
	if strings.Contains(e.Logs.String(), credentialCanary) {
		t.Error("the value is in the deployer's log")
	}
}

// credentialsVault starts a Vault stand-in with a KV mount "secret" and
// returns it with the deployer's settings of a login that may write the
// projects' paths.
func credentialsVault(t *testing.T) (*vaulttest.Server, map[string]string) {
	t.Helper()
	vault := vaulttest.New(t)
	vault.EnableKV("", "secret")
	tok := vault.CreateToken("", vaulttest.TokenSpec{WritePaths: []string{"secret/data/projects/*"}})
	return vault, map[string]string{"CREDENTIALS_VAULT_ADDR": vault.URL(), "CREDENTIALS_VAULT_TOKEN": tok}
}

// TestCredentialValueWithoutVault: without CREDENTIALS_VAULT_ADDR a value
// is refused (422 naming value) and nothing is stored.
func TestCredentialValueWithoutVault(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	key := e.Key("cred", []auth.Scope{auth.ScopeCredentialsWrite}, dt.Project)
	resp, body := e.Do("POST", "/api/v1/credentials", key, map[string]any{"name": "db", "value": credentialCanary})
	p := dt.JSON[api.Problem](t, body)
	if resp.StatusCode != 422 || len(p.Errors) != 1 || p.Errors[0].Field != "value" || strings.Contains(string(body), credentialCanary) {
		t.Errorf("value without Vault: %d %s", resp.StatusCode, body)
	}
	_, body = e.Do("GET", "/api/v1/credentials", key, nil)
	if list := dt.JSON[api.CredentialList](t, body); len(list.Items) != 0 {
		t.Errorf("stored: %s", body)
	}
}

// TestCredentialValueVaultSealed: while Vault cannot take the value (it is
// sealed), a credential's value answers 503 with a Retry-After and stores
// nothing; once Vault is back the same request is stored.
func TestCredentialValueVaultSealed(t *testing.T) {
	t.Parallel()
	vault := vaulttest.New(t)
	vault.EnableKV("", "secret")
	tok := vault.CreateToken("", vaulttest.TokenSpec{WritePaths: []string{"secret/data/projects/*"}})
	e := dt.Start(t, dt.Options{NoInfra: true, Env: map[string]string{"CREDENTIALS_VAULT_ADDR": vault.URL(), "CREDENTIALS_VAULT_TOKEN": tok}})
	key := e.Key("cred", []auth.Scope{auth.ScopeCredentialsWrite}, dt.Project)
	req := map[string]any{"project_id": dt.Project, "name": "db", "value": credentialCanary}

	vault.SetSealed(true)
	resp, body := e.Do("POST", "/api/v1/credentials", key, req)
	assertRetryLater(t, "POST /api/v1/credentials with Vault sealed", resp, body)
	if _, body := e.Do("GET", "/api/v1/credentials", key, nil); len(dt.JSON[api.CredentialList](t, body).Items) != 0 {
		t.Errorf("stored while Vault was sealed: %s", body)
	}
	vault.SetSealed(false)
	if resp, body := e.Do("POST", "/api/v1/credentials", key, req); resp.StatusCode != 201 {
		t.Errorf("once Vault is back: %d %s", resp.StatusCode, body)
	}
}
