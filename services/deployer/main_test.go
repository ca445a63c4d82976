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
		Env:      []string{"API_ADDR=127.0.0.1:0"},
		Commands: []string{"keys"},
	})
}
