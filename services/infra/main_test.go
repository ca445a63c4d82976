package main

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/app"
)

// TestBinary runs the real binary end to end: --help, a configuration
// error, and a full start (migrations on an empty database, readiness,
// metrics) and graceful stop on SIGTERM.
func TestBinary(t *testing.T) {
	testenv.ServiceBinaryTests(t, testenv.ServiceBinary{
		Dir:              ".",
		Summary:          app.Summary,
		DefaultAdminAddr: app.DefaultAdminAddr,
		Env: []string{
			"PLAYBOOK_DIR=" + repoPath(t, "ansible"),
			"PLAYBOOK_RUN_ROOT=" + testenv.RunRoot(t),
			"PROJECT_SECRETS_ENV_PREFIX=PROJ_SECRET_",
		},
		// Canaries: the running binary must not show them in
		// /proc/<pid>/environ (env: secret references read them).
		Secrets: []string{
			"AUTOPROV_SECRET_CANARY=canary-env-secret-0123456789abcdef",
			"PROJ_SECRET_CANARY=canary-project-secret-0123456789abcdef",
		},
	})
}
