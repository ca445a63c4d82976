package service

import (
	"reflect"

	"github.com/autoprovisioner/autoprovisioner/pkg/harden"
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

// ScrubbedVars returns the matcher of the variables Main removes from the
// environment block for cfg, a loaded configuration (a pointer to a config
// struct): the fields tagged `secret:"true"` or `scrub:"true"`, and the
// variables starting with the value of a field tagged `scrub:"prefix"`.
// The program still reads them with os.Getenv.
func ScrubbedVars(cfg any) func(name string) bool {
	fields, err := fieldsOf(cfg)
	if err != nil {
		return func(string) bool { return false }
	}
	var names, prefixes []string
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
