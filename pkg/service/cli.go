package service

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ErrHelp is returned by ParseArgs after it wrote the usage for --help.
var ErrHelp = errors.New("help requested")

// ErrCheckConfig is returned by ParseArgs for --check-config: Run then
// loads and validates the configuration, reports it, and exits without
// starting the service (what `autoprov validate` and deploy checks run).
var ErrCheckConfig = errors.New("configuration check requested")

// ErrCheckSecrets is returned by ParseArgs for --check-secrets: Run then
// checks the configuration as for --check-config and, when it is valid,
// resolves every secret reference it names (see SecretChecker).
var ErrCheckSecrets = errors.New("secret check requested")

// UsageError is a mistake on the command line; ExitCode maps it to 2.
type UsageError struct {
	Err error
}

// Error implements error.
func (e *UsageError) Error() string { return e.Err.Error() + " (see --help)" }

// Unwrap returns the underlying error.
func (e *UsageError) Unwrap() error { return e.Err }

// ParseArgs handles the command line the services share: no arguments,
// -h/--help, which writes Usage(stdout, name, summary, cfg) and returns
// ErrHelp, --check-config, which returns ErrCheckConfig, or
// --check-secrets [--secret-refs FILE], which returns ErrCheckSecrets.
// Anything else is a *UsageError. Services take their configuration from
// the environment only.
func ParseArgs(args []string, stdout io.Writer, name, summary string, cfg any) error {
	_, err := parseArgs(args, stdout, name, summary, cfg, nil)
	return err
}

// parseArgs is ParseArgs; it also returns the --secret-refs file. --help
// lists cmds.
func parseArgs(args []string, stdout io.Writer, name, summary string, cfg any, cmds []Command) (refsFile string, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	checkSecrets := fs.Bool("check-secrets", false, "validate the configuration, resolve every secret reference it names, and exit")
	fs.StringVar(&refsFile, "secret-refs", "", "with --check-secrets: JSON lines of further references to check")
	err = fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout, name, summary, cfg, cmds)
		return "", ErrHelp
	case err != nil:
		return "", &UsageError{Err: err}
	case fs.NArg() > 0 && len(cmds) > 0:
		return "", &UsageError{Err: fmt.Errorf("unexpected argument %q (commands: %s)", fs.Arg(0), commandNames(cmds))}
	case fs.NArg() > 0:
		return "", &UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	case refsFile != "" && !*checkSecrets:
		return "", &UsageError{Err: errors.New("--secret-refs needs --check-secrets")}
	case *checkSecrets:
		return refsFile, ErrCheckSecrets
	case *check:
		return "", ErrCheckConfig
	}
	return "", nil
}

// ExitCode maps the error a run function returned to the process exit
// status: 0 for nil and ErrHelp, 2 for configuration and usage errors
// (*ConfigError, *UsageError), 1 otherwise (a *SecretsError: some secret
// reference did not pass --check-secrets).
func ExitCode(err error) int {
	var cfgErr *ConfigError
	var usageErr *UsageError
	switch {
	case err == nil, errors.Is(err, ErrHelp), errors.Is(err, ErrCheckConfig), errors.Is(err, ErrCheckSecrets):
		return 0
	case errors.As(err, &cfgErr), errors.As(err, &usageErr):
		return 2
	}
	return 1
}

// commandNames lists the names of cmds, comma-separated.
func commandNames(cmds []Command) string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}
