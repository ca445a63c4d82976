package webhooks_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// TestPythonExampleVerifies runs the Python verification example of
// docs/webhooks.md on signatures made by Sign.
func TestPythonExampleVerifies(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```python\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no Python example in docs/webhooks.md")
	}
	secret := webhooks.DeriveSecret([]byte("0123456789abcdef0123456789abcdef"), "key")
	body := `{"event":"deployment.finished","deployment_id":"d"}`
	good := hmacsig.Sign(secret, time.Now(), []byte(body))
	old := hmacsig.Sign(secret, time.Now().Add(-time.Hour), []byte(body))
	script := example + `
import sys
secret, good, old, body = sys.argv[1:5]
print(verify(secret, good, body.encode()), verify(secret, good, body.encode() + b" "), verify(secret, old, body.encode()), verify(secret + "x", good, body.encode()))
`
	out, err := exec.Command("python3", "-c", script, secret, good, old, body).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "True False False False" {
		t.Errorf("the Python example says %q, want True False False False", got)
	}
}
