package service

import (
	"reflect"
	"slices"

	"github.com/autoprovisioner/autoprovisioner/pkg/service/internal/harden"
)

// ScrubTag on a configuration field says what Main removes from the
// process's environment block (/proc/<pid>/environ) once the
// configuration is loaded, next to every field tagged `secret:"true"`:
//
//   - "true": the variable itself, for a value holding a credential that is
//     not masked as a whole in logs (DATABASE_URL, REDIS_URL: their
//     passwords);
//   - "prefix": every variable whose name starts with the field's value
//     (SECRETS_ENV_PREFIX: the variables env: secret references read).
const ScrubTag = "scrub"

// LibrarySecretVars are credentials no configuration field declares but
// that the libraries every service links read from the environment on
// their own: pgx reads PGPASSWORD when DATABASE_URL has no password, the
// AWS SDK's default credential chain (the EC2 detector without
// EC2_ACCESS_KEY_ID) reads the secret key and the session token. Main
// scrubs them too.
var LibrarySecretVars = []string{"PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}

// ScrubbedVars returns the matcher of the variables Main removes from the
// environment block for cfg, a loaded configuration (a pointer to a config
// struct): the fields tagged `secret:"true"` or `scrub:"true"`, the
// variables starting with the value of a field tagged `scrub:"prefix"`,
// and LibrarySecretVars. The program still reads them with os.Getenv.
func ScrubbedVars(cfg any) func(name string) bool {
	fields, err := fieldsOf(cfg)
	if err != nil {
		return harden.Names(LibrarySecretVars)
	}
	names := slices.Clone(LibrarySecretVars)
	var prefixes []string
	for _, f := range fields {
		switch {
		case f.Secret || f.Scrub == "true":
			names = append(names, f.Key)
		case f.Scrub == "prefix" && f.Value.Kind() == reflect.String:
			prefixes = append(prefixes, f.Value.String())
		}
	}
	return harden.Names(names, prefixes...)
}

// hardenProcess protects a service process holding secrets from anyone
// sharing its user and from the processes it starts, once cfg is loaded:
// it removes the variables ScrubbedVars names from its environment block
// (re-executing the binary once when any is there; Main restored them
// before the configuration was loaded again), then makes it non-dumpable
// (no ptrace, /proc/<pid>/environ and mem root's only) with a core file
// size limit of 0.
func hardenProcess(cfg any) error {
	if err := harden.ScrubEnv(ScrubbedVars(cfg)); err != nil {
		return err
	}
	return harden.NoDumps()
}
