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
	t.Parallel()
	testenv.ServiceBinaryTests(t, testenv.ServiceBinary{
		Dir:              ".",
		Summary:          app.Summary,
		DefaultAdminAddr: app.DefaultAdminAddr,
		Env:              []string{"REQUEST_SIGNING_KEY_ID=scheduler-test"},
		// Canaries: the running binary must not show them in
		// /proc/<pid>/environ (env: secret references read the last one).
		Secrets: []string{
			"REQUEST_SIGNING_KEY=canary-request-signing-key-0123456789abcdef",
			"AUTOPROV_SECRET_CANARY=canary-env-secret-0123456789abcdef",
			// Read by the AWS SDK's default credential chain, declared by
			// no configuration field.
			"AWS_SECRET_ACCESS_KEY=canary-aws-secret-access-key-0123456789",
			"AWS_SESSION_TOKEN=canary-aws-session-token-0123456789abcdef",
		},
		Commands: []string{"servers"},
	})
}
