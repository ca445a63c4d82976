package service

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrHelp is returned by ParseArgs after it wrote the usage for --help.
var ErrHelp = errors.New("help requested")

// UsageError is a mistake on the command line; ExitCode maps it to 2.
type UsageError struct {
	Err error
}

// Error implements error.
func (e *UsageError) Error() string { return e.Err.Error() + " (see --help)" }

// Unwrap returns the underlying error.
func (e *UsageError) Unwrap() error { return e.Err }

// ParseArgs handles the command line the services share: no arguments, or
// -h/--help, which writes Usage(stdout, name, summary, cfg) and returns
// ErrHelp. Anything else is a *UsageError. Services take their
// configuration from the environment only.
func ParseArgs(args []string, stdout io.Writer, name, summary string, cfg any) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		Usage(stdout, name, summary, cfg)
		return ErrHelp
	case err != nil:
		return &UsageError{Err: err}
	case fs.NArg() > 0:
		return &UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// ExitCode maps the error a run function returned to the process exit
// status: 0 for nil and ErrHelp, 2 for configuration and usage errors
// (*ConfigError, *UsageError), 1 otherwise.
func ExitCode(err error) int {
	var cfgErr *ConfigError
	var usageErr *UsageError
	switch {
	case err == nil, errors.Is(err, ErrHelp):
		return 0
	case errors.As(err, &cfgErr), errors.As(err, &usageErr):
		return 2
	}
	return 1
}
