package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
)

// TestSink: a delivery signed with a secret of the file is accepted (204),
// logged as valid and kept as received; a wrong signature is refused (401)
// and logged with why; a secret added to the file later counts.
func TestSink(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "webhook.secret")
	if err := os.WriteFile(secrets, []byte("whsec_first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	s := &sink{secrets: secrets, dir: dir, log: &log}
	body := []byte(`{"event":"deployment.finished","deployment_id":"d1","deployment":{"status":"succeeded"}}`)
	post := func(secret string) int {
		req := httptest.NewRequest(http.MethodPost, "/hooks/deploy", bytes.NewReader(body))
		req.Header.Set(hmacsig.HeaderSignature, hmacsig.Sign(secret, time.Now(), body))
		req.Header.Set(hmacsig.HeaderID, "w1")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code
	}
	lastLine := func() delivery {
		lines := strings.Split(strings.TrimSpace(log.String()), "\n")
		var d delivery
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}

	if code := post("whsec_first"); code != http.StatusNoContent {
		t.Fatalf("signed with the file's secret: %d, want 204", code)
	}
	if d := lastLine(); d.Signature != "valid" || d.DeploymentID != "d1" || d.Status != "succeeded" || d.ID != "w1" {
		t.Errorf("log line %+v", d)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "last.json")); !bytes.Equal(got, body) {
		t.Errorf("last.json = %q, want the raw body", got)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "last.sig")); hmacsig.Verify("whsec_first", strings.TrimSpace(string(got)), body, time.Minute, time.Now()) != nil {
		t.Errorf("last.sig %q does not verify", got)
	}

	if code := post("whsec_other"); code != http.StatusUnauthorized {
		t.Fatalf("signed with another secret: %d, want 401", code)
	}
	if d := lastLine(); !strings.Contains(d.Signature, "does not match") {
		t.Errorf("refusal logged as %q", d.Signature)
	}
	if err := os.WriteFile(secrets, []byte("whsec_first\nwhsec_other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := post("whsec_other"); code != http.StatusNoContent {
		t.Fatalf("a secret added later: %d, want 204", code)
	}
}
