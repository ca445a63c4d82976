package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestKeysCommandAndAPI manages keys with `deployer keys` and uses them on
// the API of the real binary.
func TestKeysCommandAndAPI(t *testing.T) {
	bin := testenv.BuildBinary(t, ".")
	dsn := testenv.Postgres(t)
	signing := "binary-test-webhook-signing-key-0123456789"
	env := testenv.BinaryEnv("DATABASE_URL="+dsn, "REDIS_URL="+testenv.RedisURL(t), "WEBHOOK_SIGNING_KEY="+signing)

	stdout, stderr, code := testenv.RunBinary(t, bin, env, "keys", "create", "--name", "ci", "--scopes", "deployments:write", "--json")
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
	stdout, _, code = testenv.RunBinary(t, bin, env, "keys", "create", "--name", "ops", "--scopes", "servers:read")
	if code != 0 || !strings.Contains(stdout, "not shown again") || !strings.Contains(stdout, "apk_") {
		t.Fatalf("keys create (text): %d %s", code, stdout)
	}
	stdout, _, code = testenv.RunBinary(t, bin, env, "keys", "list")
	if code != 0 || !strings.Contains(stdout, "ci") || !strings.Contains(stdout, "ops") || strings.Contains(stdout, created.Key) {
		t.Fatalf("keys list: %d %s", code, stdout)
	}
	for _, bad := range [][]string{
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
