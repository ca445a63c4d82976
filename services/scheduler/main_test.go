package main

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/app"
)

// TestBinary runs the real binary end to end: --help, a configuration
// error, and a full start (migrations on an empty database, readiness,
// metrics) and graceful stop on SIGTERM.
func TestBinary(t *testing.T) {
	testenv.ServiceBinaryTests(t, testenv.ServiceBinary{
		Dir:              ".",
		Summary:          app.Summary,
		DefaultAdminAddr: app.DefaultAdminAddr,
		Commands:         []string{"servers"},
	})
}
