package main

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/app"
)

// TestBinary runs the real binary end to end: --help, a configuration
// error, and a full start (migrations on an empty database, readiness,
// metrics) and graceful stop on SIGTERM.
func TestBinary(t *testing.T) {
	testenv.ServiceBinaryTests(t, testenv.ServiceBinary{
		Dir:              ".",
		Summary:          app.Summary,
		DefaultAdminAddr: app.DefaultAdminAddr,
		// Any free port for the API: tests run side by side.
		Env: []string{"API_ADDR=127.0.0.1:0", "REQUEST_SIGNING_KEY_ID=deployer-test"},
		// Canaries: the running binary must not show them in
		// /proc/<pid>/environ.
		Secrets: []string{
			"WEBHOOK_SIGNING_KEY=canary-webhook-signing-key-0123456789abcdef",
			"REQUEST_SIGNING_KEY=canary-request-signing-key-0123456789abcdef",
			// Read by pgx itself, declared by no configuration field.
			"PGPASSWORD=canary-pgpassword-0123456789abcdef",
		},
		Commands: []string{"keys"},
	})
}
