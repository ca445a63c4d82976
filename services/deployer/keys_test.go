package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestKeysCommandAndAPI manages keys with `deployer keys` and uses them on
// the API of the real binary.
func TestKeysCommandAndAPI(t *testing.T) {
	bin := testenv.BuildBinary(t, ".")
	dsn := testenv.Postgres(t)
	signing := "binary-test-webhook-signing-key-0123456789"
	env := testenv.BinaryEnv("DATABASE_URL="+dsn, "REDIS_URL="+testenv.RedisURL(t), "WEBHOOK_SIGNING_KEY="+signing)

	const project, other = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
	stdout, stderr, code := testenv.RunBinary(t, bin, env, "keys", "create", "--name", "ci", "--scopes", "deployments:write",
		"--project", strings.ToUpper(project), "--json")
	if code != 0 {
		t.Fatalf("keys create: exit %d: %s", code, stderr)
	}
	var created struct {
		ID, Key, WebhookSecret string
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("keys create --json: %v: %s", err, stdout)
	}
	created.ID, created.Key, created.WebhookSecret = raw["id"].(string), raw["key"].(string), raw["webhook_secret"].(string)
	if !strings.HasPrefix(created.Key, "apk_") || !strings.HasPrefix(created.WebhookSecret, "whsec_") {
		t.Fatalf("created %s", stdout)
	}
	if p, _ := raw["projects"].([]any); len(p) != 1 || p[0] != project || raw["fleet_wide"] != false {
		t.Errorf("created key's projects: %s", stdout)
	}
	stdout, _, code = testenv.RunBinary(t, bin, env, "keys", "create", "--name", "ops", "--scopes", "servers:read")
	if code != 0 || !strings.Contains(stdout, "not shown again") || !strings.Contains(stdout, "apk_") {
		t.Fatalf("keys create (text): %d %s", code, stdout)
	}
	stdout, _, code = testenv.RunBinary(t, bin, env, "keys", "list")
	if code != 0 || !strings.Contains(stdout, "ci") || !strings.Contains(stdout, "ops") || strings.Contains(stdout, created.Key) {
		t.Fatalf("keys list: %d %s", code, stdout)
	}
	if !strings.Contains(stdout, "PROJECTS") || !strings.Contains(stdout, project) || !strings.Contains(stdout, "* (fleet-wide)") ||
		strings.Contains(stdout, "WARNING") {
		t.Errorf("keys list shows no projects, or warns without a legacy key:\n%s", stdout)
	}
	// A key from before the binding, as migration 00048 leaves it: listed
	// as legacy with a warning until set-projects narrows it.
	if _, _, code := testenv.RunBinary(t, bin, env, "keys", "create", "--name", "old-ci", "--scopes", "deployments:read", "--fleet-wide"); code != 0 {
		t.Fatal("keys create --fleet-wide failed")
	}
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(context.Background(), `UPDATE api_keys SET legacy = true WHERE name = 'old-ci'`); err != nil {
		t.Fatal(err)
	}
	stdout, _, _ = testenv.RunBinary(t, bin, env, "keys", "list")
	if !strings.Contains(stdout, "fleet-wide, legacy") || !strings.Contains(stdout, "WARNING: 1 live key(s)") || !strings.Contains(stdout, "old-ci") {
		t.Errorf("keys list does not flag the legacy key:\n%s", stdout)
	}
	stdout, stderr, code = testenv.RunBinary(t, bin, env, "keys", "set-projects", "old-ci", "--project", other+","+project)
	if code != 0 || !strings.Contains(stdout, other+","+project) {
		t.Fatalf("keys set-projects: %d %s %s", code, stdout, stderr)
	}
	if stdout, _, _ = testenv.RunBinary(t, bin, env, "keys", "list"); strings.Contains(stdout, "WARNING") || strings.Contains(stdout, "legacy") {
		t.Errorf("the narrowed key is still flagged:\n%s", stdout)
	}
	for _, bad := range [][]string{
		{"keys", "create", "--name", "x", "--scopes", "deployments:read"},                      // no project
		{"keys", "create", "--name", "x", "--scopes", "deployments:read", "--project", "acme"}, // no project id
		{"keys", "create", "--name", "x", "--scopes", "admin", "--project", project},           // admin is fleet-wide
		{"keys", "create", "--name", "x", "--scopes", "servers:write", "--project", project},   // so are servers keys
		{"keys", "create", "--name", "x", "--scopes", "deployments:read", "--project", project, "--fleet-wide"},
		{"keys", "set-projects", "ci"},
		{"keys", "set-projects", "ops", "--project", project},
		{"keys", "create", "--name", "x", "--scopes", "root"},
		{"keys", "create", "--name", "bad name", "--scopes", "admin"},
		{"keys", "create", "--name", "ci", "--scopes", "admin"}, // a live key has the name
		{"keys", "revoke", "nobody"},
		{"keys", "frobnicate"},
		{"keys"},
	} {
		if _, stderr, code := testenv.RunBinary(t, bin, env, bad...); code == 0 {
			t.Errorf("%v succeeded: %s", bad, stderr)
		}
	}

	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := testenv.StartBinary(t, bin, append(env, "API_ADDR="+api, "ADMIN_ADDR="+admin, "API_KEY_CACHE_TTL=0s", "LOG_FORMAT=json"))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	get := func(key string) int {
		req, _ := http.NewRequest("GET", "http://"+api+"/api/v1/deployments", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get(created.Key); c != 200 {
		t.Fatalf("the new key: %d", c)
	}
	if _, stderr, code := testenv.RunBinary(t, bin, env, "keys", "revoke", "ci"); code != 0 {
		t.Fatalf("keys revoke: %d %s", code, stderr)
	}
	if c := get(created.Key); c != 401 {
		t.Errorf("the revoked key: %d, want 401", c)
	}
	metrics := p.WaitHTTP("http://"+admin+"/metrics", 200, 10*time.Second)
	if !strings.Contains(metrics, "autoprov_deployer_http_request_duration_seconds") {
		t.Error("/metrics lacks the API's metrics")
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
	if strings.Contains(p.Stderr(), created.Key) || strings.Contains(p.Stderr(), signing) {
		t.Error("a key or the signing key is in the logs")
	}
}

// TestKeysJSONShape: `deployer keys create --json` and `keys list --json`
// print keys in one shape, the API's (the OpenAPI schemas CreatedKey and
// KeyList): snake_case, the key's rate, projects and fleet_wide, null for
// a key never used or revoked; the API answers the same object. --rate 0
// is refused with what to do instead.
func TestKeysJSONShape(t *testing.T) {
	bin := testenv.BuildBinary(t, ".")
	dsn := testenv.Postgres(t)
	env := testenv.BinaryEnv("DATABASE_URL="+dsn, "REDIS_URL="+testenv.RedisURL(t),
		"WEBHOOK_SIGNING_KEY=binary-test-webhook-signing-key-0123456789", "API_RATE_LIMIT=40", "API_RATE_BURST=90")
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := testenv.RunBinary(t, bin, env, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		return stdout
	}
	const project = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	viewFields := []string{"created_at", "default_rate", "fleet_wide", "id", "last_used_at", "legacy_fleet_wide", "name",
		"prefix", "projects", "rate_burst", "rate_limit", "revoked_at", "scopes"}
	fields := func(m map[string]any) []string {
		return slices.Sorted(maps.Keys(m))
	}

	out := run("keys", "create", "--name", "ci", "--scopes", "deployments:write", "--project", project, "--json")
	dt.CheckSchema(t, "CreatedKey", []byte(out))
	var ci map[string]any
	if err := json.Unmarshal([]byte(out), &ci); err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(viewFields), "key", "webhook_secret"); !slices.Equal(fields(ci), slices.Sorted(slices.Values(want))) {
		t.Errorf("keys create --json fields %v, want %v", fields(ci), want)
	}
	if ci["rate_limit"] != 40.0 || ci["rate_burst"] != 90.0 || ci["default_rate"] != true || ci["revoked_at"] != nil ||
		ci["last_used_at"] != nil || ci["fleet_wide"] != false || !slices.Equal(ci["projects"].([]any), []any{project}) {
		t.Errorf("keys create --json: %s", out)
	}
	out = run("keys", "create", "--name", "admin", "--scopes", "admin", "--rate", "7", "--json")
	var admin map[string]any
	if err := json.Unmarshal([]byte(out), &admin); err != nil {
		t.Fatal(err)
	}
	if admin["rate_limit"] != 7.0 || admin["rate_burst"] != 14.0 || admin["default_rate"] != false || admin["fleet_wide"] != true {
		t.Errorf("keys create --rate 7 --json: %s", out)
	}

	// --rate 0 (or below) is refused, saying what to do instead.
	for _, rate := range []string{"0", "-3"} {
		_, stderr, code := testenv.RunBinary(t, bin, env, "keys", "create", "--name", "zero", "--scopes", "admin", "--rate", rate)
		if code == 0 || !strings.Contains(stderr, "omit --rate for the deployer's default") {
			t.Errorf("keys create --rate %s: exit %d: %s", rate, code, stderr)
		}
	}

	run("keys", "revoke", "ci")
	out = run("keys", "list", "--json")
	dt.CheckSchema(t, "KeyList", []byte(out))
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 {
		t.Fatalf("keys list --json: %v %s", err, out)
	}
	byName := map[string]map[string]any{}
	for _, it := range list.Items {
		if !slices.Equal(fields(it), viewFields) {
			t.Errorf("keys list --json item fields %v, want %v", fields(it), viewFields)
		}
		byName[it["name"].(string)] = it
	}
	if byName["ci"]["revoked_at"] == nil || byName["admin"]["revoked_at"] != nil || byName["admin"]["rate_limit"] != 7.0 {
		t.Errorf("keys list --json: %s", out)
	}

	// The API shows the same key as the same object.
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := testenv.StartBinary(t, bin, append(env, "API_ADDR="+api, "ADMIN_ADDR="+adminAddr))
	p.WaitHTTP("http://"+adminAddr+"/readyz", 200, time.Minute)
	req, _ := http.NewRequest("GET", "http://"+api+"/api/v1/keys/"+byName["ci"]["id"].(string), nil)
	req.Header.Set("Authorization", "Bearer "+admin["key"].(string))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var fromAPI map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&fromAPI); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/v1/keys/{id}: %d %v", resp.StatusCode, err)
	}
	if a, c := mustJSON(t, fromAPI), mustJSON(t, byName["ci"]); a != c {
		t.Errorf("the API and keys list --json differ:\napi: %s\ncli: %s", a, c)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
