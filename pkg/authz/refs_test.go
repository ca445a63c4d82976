package authz

import (
	"errors"
	"strings"
	"testing"
)

const (
	projectA = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	projectB = "11111111-2222-4333-8444-555555555555"
)

func TestRefBoundToProject(t *testing.T) {
	a := newAuthorizer(t, Config{SecretRefs: []string{
		"vault:secret/projects/{project_id}/**",
		"vault:secret/shared/github#token",
		"env:AUTOPROV_PROJECT_{PROJECT_ID}_*",
		"file:projects/{project_id}/*#*",
	}})
	own := []string{"vault:secret/infra/ssh#private_key", "file:deploy_key", "vault:secret/projects/" + projectA + "/ssh#key"}
	cases := []struct {
		ref string
		ok  bool
	}{
		{"vault:secret/projects/" + projectA + "/app#DB_PASSWORD", true},
		{"vault:secret/projects/" + projectA + "/app", true},
		{"vault:secret/projects/" + projectA + "/deep/er?version=3#x", true},
		{"vault:secret/shared/github#token", true},
		{"env:AUTOPROV_PROJECT_9B2F4C6E_1D3A_4E5B_8C7D_0A1B2C3D4E5F_GIT", true},
		{"file:projects/" + projectA + "/creds.json#api_key", true},

		// Another project's secrets.
		{"vault:secret/projects/" + projectB + "/app#DB_PASSWORD", false},
		{"env:AUTOPROV_PROJECT_11111111_2222_4333_8444_555555555555_GIT", false},
		// ** needs at least one segment; no escaping the project.
		{"vault:secret/projects/" + projectA, false},
		{"vault:secret/projects#x", false},
		// The field is pinned where the template says so.
		{"vault:secret/shared/github#other", false},
		{"vault:secret/shared/github", false},
		{"file:projects/" + projectA + "/creds.json", false},
		// The service's own credentials, and anything else.
		{"vault:secret/infra/ssh#private_key", false},
		{"vault:kv-admin/root#password", false},
		{"env:AUTOPROV_SECRET_SSH_KEY", false},
		{"env:VAULT_TOKEN", false},
		{"file:deploy_key", false},
		// Own credential inside the project's space: refused whatever the
		// version or field.
		{"vault:secret/projects/" + projectA + "/ssh#key", false},
		{"vault:secret/projects/" + projectA + "/ssh?version=1#other", false},
		{"vault:secret/projects/" + projectA + "/ssh", false},
		{"not-a-ref", false},
	}
	for _, tc := range cases {
		_, err := a.Ref(projectA, "secrets_ref", tc.ref, own)
		if tc.ok && err != nil {
			t.Errorf("%s: %v", tc.ref, err)
		}
		if !tc.ok {
			var re *RefError
			if !errors.As(err, &re) || !errors.Is(err, ErrDenied) {
				t.Errorf("%s: err = %v, want a refusal", tc.ref, err)
			}
		}
	}
	if _, err := a.Ref("not-a-uuid", "secrets_ref", "vault:secret/projects/not-a-uuid/app#x", nil); !errors.Is(err, ErrDenied) {
		t.Errorf("invalid project id: %v", err)
	}
	_, err := a.Ref(projectA, "secrets_ref", "vault:secret/infra/ssh#private_key", own)
	if !strings.Contains(err.Error(), "credential of the service") {
		t.Errorf("reason: %v", err)
	}
}

func TestRefDefaultTemplate(t *testing.T) {
	a, err := New(Config{SecretRefs: []string{"vault:secret/projects/{project_id}/**"}}, Options{InterfaceAddrs: fakeIfaces()})
	if err != nil {
		t.Fatal(err)
	}
	// The attacks: the fleet's key by its README reference, the
	// same key file, an env token, another mount.
	for _, ref := range []string{"vault:secret/infra/ssh#private_key", "file:id_ed25519", "env:AUTOPROV_SECRET_GIT_TOKEN", "vault:kv-admin/x#y"} {
		if _, err := a.Ref(projectA, "github_token_ref", ref, nil); !errors.Is(err, ErrDenied) {
			t.Errorf("%s allowed by the default", ref)
		}
	}
	empty, err := New(Config{}, Options{InterfaceAddrs: fakeIfaces()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := empty.Ref(projectA, "secrets_ref", "vault:secret/projects/"+projectA+"/x#y", nil); !errors.Is(err, ErrDenied) {
		t.Error("no templates: a reference was allowed")
	}
}
