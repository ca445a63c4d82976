package app

import (
	"cmp"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/harden"
)

// ScrubbedVars are the variables of credentials that Harden removes from
// the environment block the kernel shows in /proc/<pid>/environ; the
// service still reads them. Variables starting with SECRETS_ENV_PREFIX or
// PROJECT_SECRETS_ENV_PREFIX (env: secrets) go too. The _FILE variants
// (VAULT_TOKEN_FILE, TIME4VPS_PASSWORD_FILE, DATABASE_URL_FILE,
// REDIS_URL_FILE, ...) keep the values out of the environment altogether.
var ScrubbedVars = []string{
	"VAULT_TOKEN", "VAULT_SECRET_ID", "PROJECT_VAULT_TOKEN", "PROJECT_VAULT_SECRET_ID",
	"TIME4VPS_PASSWORD", "DATABASE_URL", "REDIS_URL",
}

// Harden protects the process before anything else runs (call it first in
// main): it scrubs the credentials from its initial environment block
// (re-executing itself once when any is set) and makes it non-dumpable
// without core files, so that plays and anything else running as the same
// user cannot read its memory or environment.
func Harden() error {
	prefixes := []string{cmp.Or(os.Getenv("SECRETS_ENV_PREFIX"), "AUTOPROV_SECRET_"), os.Getenv("PROJECT_SECRETS_ENV_PREFIX")}
	if err := harden.ScrubEnv(harden.Names(ScrubbedVars, prefixes...)); err != nil {
		return err
	}
	return harden.NoDumps()
}
