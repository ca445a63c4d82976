package cli

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestValidateInventoryRefusedAddresses: `autoprov validate` lists the
// inventory's hosts the scheduler would refuse for their address (with
// Ansible's own parser), each by name, and lets the test targets of the
// scheduler's SPECIAL_ALLOW_NETWORKS (from the --env-file) through.
func TestValidateInventoryRefusedAddresses(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("ansible-inventory"); err != nil {
		t.Fatalf("ansible-inventory is missing (make test installs it): %v", err)
	}
	write := fileWriter(t, t.TempDir())
	inv := write("hosts.yml", `all:
  children:
    web:
      hosts:
        web-1: {ansible_host: 192.0.2.10}
        meta: {ansible_host: 169.254.169.254}
        bad-host: {ansible_host: 'not_a_host!'}
        loop: {ansible_host: 127.0.0.1}
        any: {ansible_host: 0.0.0.0}
        localhost: {}
`)
	check := func(file map[string]string) checkResult {
		t.Helper()
		c := &validateCmd{NoSecrets: true, Timeout: time.Minute}
		g := &globals{ctx: context.Background(), json: true, envFile: "settings.env", file: file,
			env: Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: os.Getenv}}
		r, _ := c.checkInventory(g, inv)
		return r
	}
	r := check(map[string]string{})
	if r.OK {
		t.Fatalf("inventory with special addresses passed: %+v", r)
	}
	got := strings.Join(r.Problems, "\n")
	for _, want := range []string{"host meta: address 169.254.169.254 refused (metadata)", "host bad-host: address \"not_a_host!\" refused",
		"host loop: address 127.0.0.1 refused (loopback)", "host any: address 0.0.0.0 refused (unspecified)",
		"host localhost: address localhost refused (loopback)"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "web-1") || len(r.Problems) != 5 {
		t.Errorf("problems:\n%s\nwant the five refused hosts only", got)
	}
	// The operator's allow-list lets the loopback test targets through,
	// never the metadata address.
	r = check(map[string]string{"SPECIAL_ALLOW_NETWORKS": "127.0.0.0/8"})
	got = strings.Join(r.Problems, "\n")
	if strings.Contains(got, "host loop:") || strings.Contains(got, "host localhost:") || !strings.Contains(got, "host meta:") || len(r.Problems) != 3 {
		t.Errorf("with SPECIAL_ALLOW_NETWORKS=127.0.0.0/8:\n%s", got)
	}
}
