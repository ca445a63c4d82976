package vaulttest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
)

type reply struct {
	status int
	raw    string
	body   map[string]any
}

func do(t *testing.T, s *Server, method, path, token, ns, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Vault-Token", token)
	}
	if ns != "" {
		req.Header.Set("X-Vault-Namespace", ns)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: string(b)}
	if err := json.Unmarshal(b, &r.body); err != nil {
		t.Fatalf("%s %s: body is not a JSON object: %q", method, path, b)
	}
	return r
}

func keys(v any) []string {
	m, _ := v.(map[string]any)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var envelopeKeys = []string{"auth", "data", "lease_duration", "lease_id", "mount_type", "renewable", "request_id", "warnings", "wrap_info"}

// Shapes from Vault's API docs (auth/approle "Login with AppRole", auth/token
// "Lookup a Token (Self)" and "Renew a Token (Self)", secret/kv/kv-v2 "Read
// Secret Version").
func TestDocumentedShapes(t *testing.T) {
	clock := clocktest.NewFake(time.Unix(1_700_000_000, 0))
	s := New(t, WithClock(clock))
	s.AddAppRole("", "approle", AppRole{Name: "app", RoleID: "rid", SecretID: "sid",
		Token: TokenSpec{TTL: time.Hour, MaxTTL: 90 * time.Minute, Renewable: true}})
	s.Put("", "secret", "a/b", map[string]any{"foo": "bar"})
	s.Put("", "secret", "a/b", map[string]any{"foo": "baz"})

	login := do(t, s, "POST", "/v1/auth/approle/login", "", "", `{"role_id":"rid","secret_id":"sid"}`)
	if login.status != 200 || !strings.Contains(login.raw, `"data":null`) {
		t.Fatalf("login: %d %s", login.status, login.raw)
	}
	if diff := cmp.Diff(envelopeKeys, keys(login.body)); diff != "" {
		t.Errorf("login envelope (-want, +got):\n%s", diff)
	}
	auth := login.body["auth"].(map[string]any)
	for _, k := range []string{"client_token", "accessor", "policies", "token_policies", "metadata", "lease_duration", "renewable"} {
		if _, ok := auth[k]; !ok {
			t.Errorf("login auth has no %q", k)
		}
	}
	tok := auth["client_token"].(string)
	if auth["lease_duration"].(float64) != 3600 || auth["renewable"] != true || !strings.HasPrefix(tok, "hvs.") {
		t.Errorf("login auth = %v", auth)
	}

	look := do(t, s, "GET", "/v1/auth/token/lookup-self", tok, "", "")
	data := look.body["data"].(map[string]any)
	want := []string{"accessor", "creation_time", "creation_ttl", "display_name", "entity_id", "expire_time",
		"explicit_max_ttl", "id", "issue_time", "meta", "num_uses", "orphan", "path", "policies", "renewable", "ttl", "type"}
	if diff := cmp.Diff(want, keys(data)); diff != "" {
		t.Errorf("lookup-self data (-want, +got):\n%s", diff)
	}
	if data["ttl"].(float64) != 3600 || data["id"] != tok || data["path"] != "auth/approle/login" {
		t.Errorf("lookup-self = %v", data)
	}

	clock.Advance(30 * time.Minute)
	renew := do(t, s, "POST", "/v1/auth/token/renew-self", tok, "", `{"increment":"1h"}`)
	if renew.status != 200 || renew.body["auth"].(map[string]any)["lease_duration"].(float64) != 3600 {
		t.Errorf("renew-self: %s", renew.raw)
	}
	clock.Advance(30 * time.Minute) // an hour in, the max TTL (90m) is 30m away
	renew = do(t, s, "POST", "/v1/auth/token/renew-self", tok, "", `{"increment":3600}`)
	if got := renew.body["auth"].(map[string]any)["lease_duration"].(float64); got != 1800 || renew.body["warnings"] == nil {
		t.Errorf("capped renew-self: %s", renew.raw)
	}

	read := do(t, s, "GET", "/v1/secret/data/a/b", tok, "", "")
	kv := read.body["data"].(map[string]any)
	if diff := cmp.Diff([]string{"data", "metadata"}, keys(kv)); diff != "" {
		t.Errorf("kv read data (-want, +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"created_time", "custom_metadata", "deletion_time", "destroyed", "version"}, keys(kv["metadata"])); diff != "" {
		t.Errorf("kv metadata (-want, +got):\n%s", diff)
	}
	if kv["data"].(map[string]any)["foo"] != "baz" || kv["metadata"].(map[string]any)["version"].(float64) != 2 {
		t.Errorf("kv read = %v", kv)
	}
	v1 := do(t, s, "GET", "/v1/secret/data/a/b?version=1", tok, "", "")
	if v1.body["data"].(map[string]any)["data"].(map[string]any)["foo"] != "bar" {
		t.Errorf("version 1 = %s", v1.raw)
	}

	errorCases := []struct {
		name, method, path, token, body string
		status                          int
		errors                          string
	}{
		{"missing secret", "GET", "/v1/secret/data/a/c", tok, "", 404, `[]`},
		{"escaped slash", "GET", "/v1/secret/data/a%2Fb", tok, "", 404, `[]`},
		{"missing version", "GET", "/v1/secret/data/a/b?version=7", tok, "", 404, `[]`},
		{"no token", "GET", "/v1/secret/data/a/b", "", "", 403, `["permission denied"]`},
		{"bad token", "GET", "/v1/secret/data/a/b", "hvs.nope", "", 403, `["permission denied"]`},
		{"no mount", "GET", "/v1/nomount/data/x", tok, "", 404, `["no handler for route \"nomount/data/x\". route entry not found."]`},
		{"bad login", "POST", "/v1/auth/approle/login", "", `{"role_id":"rid","secret_id":"x"}`, 400, `["invalid role or secret ID"]`},
	}
	for _, tc := range errorCases {
		r := do(t, s, tc.method, tc.path, tc.token, "", tc.body)
		got, _ := json.Marshal(r.body["errors"])
		if r.status != tc.status || string(got) != tc.errors || len(r.body) != 1 {
			t.Errorf("%s: %d %s, want %d {\"errors\":%s}", tc.name, r.status, r.raw, tc.status, tc.errors)
		}
	}

	// Expiry follows the clock; ExpireToken ends a token at once.
	clock.Advance(31 * time.Minute)
	if r := do(t, s, "GET", "/v1/auth/token/lookup-self", tok, "", ""); r.status != 403 {
		t.Errorf("expired token: %s", r.raw)
	}
	forever := s.CreateToken("", TokenSpec{})
	if r := do(t, s, "POST", "/v1/auth/token/renew-self", forever, "", ""); r.status != 400 {
		t.Errorf("renew of a token without TTL: %s", r.raw)
	}
	s.ExpireToken(forever)
	if s.TokenValid(forever) {
		t.Error("ExpireToken did not expire")
	}
	if s.Count(EndpointAppRoleLogin) != 2 || s.Count(EndpointRenewSelf) != 3 || s.Count(EndpointLookupSelf) != 2 {
		t.Errorf("counts: login %d renew %d lookup %d", s.Count(EndpointAppRoleLogin), s.Count(EndpointRenewSelf), s.Count(EndpointLookupSelf))
	}
}

func TestNamespacesAndSeal(t *testing.T) {
	s := New(t)
	s.CreateNamespace("team-a/")
	s.Put("team-a", "secret", "x", map[string]any{"k": "v"})
	nsTok := s.CreateToken("team-a", TokenSpec{})
	rootTok := s.CreateToken("", TokenSpec{})
	if r := do(t, s, "GET", "/v1/secret/data/x", nsTok, "team-a", ""); r.status != 200 {
		t.Errorf("namespaced read: %s", r.raw)
	}
	if r := do(t, s, "GET", "/v1/secret/data/x", rootTok, "team-a", ""); r.status != 403 {
		t.Errorf("root token in team-a: %s", r.raw)
	}
	if r := do(t, s, "GET", "/v1/secret/data/x", nsTok, "", ""); r.status != 403 {
		t.Errorf("team-a token in root: %s", r.raw)
	}
	if r := do(t, s, "GET", "/v1/secret/data/x", nsTok, "team-b", ""); r.status != 404 {
		t.Errorf("unknown namespace: %s", r.raw)
	}
	s.SetSealed(true)
	if r := do(t, s, "GET", "/v1/secret/data/x", nsTok, "team-a", ""); r.status != 503 {
		t.Errorf("sealed: %s", r.raw)
	}
}
