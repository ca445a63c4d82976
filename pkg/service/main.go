package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/service/internal/harden"
)

// Program describes a service binary for Main and Run: its name, its
// configuration and its components. A service's internal/app package holds
// the two functions; its main.go only puts them together:
//
//	func main() {
//		service.Main(service.Program[*app.Config]{
//			Name: app.Name, Summary: app.Summary,
//			NewConfig: app.NewConfig, Components: app.Components,
//		})
//	}
type Program[C Config] struct {
	// Name is the service's name in logs, metrics and --help.
	Name string
	// Summary is the one-line description --help prints.
	Summary string
	// NewConfig returns the configuration with the service's own defaults
	// (a pointer to a struct embedding Common), ready for Load and Usage.
	NewConfig func() C
	// Components returns the service's long-running parts for the loaded
	// configuration (see ComponentsFunc).
	Components func(ctx context.Context, cfg C, d Deps) ([]Component, error)
	// Secrets returns what --check-secrets checks: the secret references
	// the loaded configuration names, resolved with the backends the
	// service uses at run time (getenv reads the environment the
	// configuration came from). Nil: the service names no references.
	Secrets func(ctx context.Context, cfg C, getenv func(string) string) SecretChecker
	// Commands are the binary's subcommands (its main.go runs them before
	// Main), listed by --help.
	Commands []Command
}

// Command is a subcommand of a service binary, as --help lists it.
type Command struct {
	Name    string // the first argument that runs it
	Summary string // one line
}

// Run is a service binary's whole life but the exit: it handles the
// command line (--help; --check-config loads and validates the
// configuration, writes "NAME: configuration valid" and returns nil, or
// returns the *ConfigError listing every problem; --check-secrets does the
// same, then writes one JSON SecretResult line per secret reference and
// returns a *SecretsError when some failed), loads the configuration
// from getenv (completed with the environment package AUTOPROV_ENV names,
// see WithEnvPackage), builds the logger (with a "service" field) on
// stderr, and Serves until ctx is done. Map its error to the exit status
// with ExitCode.
func Run[C Config](ctx context.Context, p Program[C], args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return run(ctx, p, args, getenv, stdout, stderr, nil)
}

// run is Run; hardenFn, when set, is called with the configuration as soon
// as it is loaded (Main: hardenProcess).
func run[C Config](ctx context.Context, p Program[C], args []string, getenv func(string) string, stdout, stderr io.Writer, hardenFn func(cfg any) error) error {
	cfg := p.NewConfig()
	refsFile, err := parseArgs(args, stdout, p.Name, p.Summary, cfg, p.Commands)
	wantSecrets := errors.Is(err, ErrCheckSecrets)
	check := wantSecrets || errors.Is(err, ErrCheckConfig)
	if err != nil && !check {
		return err // ErrHelp after --help: exit status 0
	}
	getenv, err = WithEnvPackage(getenv, p.Name)
	if err != nil {
		return err
	}
	if err := Load(getenv, cfg); err != nil {
		return err
	}
	if hardenFn != nil {
		if err := hardenFn(cfg); err != nil {
			return fmt.Errorf("harden the process: %w", err)
		}
	}
	if check {
		fmt.Fprintf(stdout, "%s: configuration valid\n", p.Name)
		if !wantSecrets {
			return nil
		}
		var checker SecretChecker
		if p.Secrets != nil {
			checker = p.Secrets(ctx, cfg, getenv)
		}
		return checkSecrets(ctx, p.Name, checker, refsFile, stdout)
	}
	common := cfg.common()
	if common.Tracing.ServiceName == "" {
		common.Tracing.ServiceName = p.Name // the spans' default service.name
	}
	logger, err := NewLogger(stderr, common.LogLevel, common.LogFormat)
	if err != nil {
		return err
	}
	logger = logger.With().Str("service", p.Name).Logger()
	return Serve(ctx, logger, cfg, getenv, func(ctx context.Context, d Deps) ([]Component, error) {
		return p.Components(ctx, cfg, d)
	})
}

// Main runs the service binary p with the process's arguments, environment
// and output, and exits: 0 after a requested shutdown or --help, 2 for
// configuration and usage errors, 1 otherwise (see ExitCode). The first
// SIGINT/SIGTERM drains the service; a second one exits at once with
// status 130/143 (see WithShutdownSignals).
//
// Every service is hardened here, so that none can forget it: once its
// configuration is loaded, the secrets it names (see ScrubbedVars) are
// removed from the process's environment block, which re-executes the
// binary once (the new image reads them back before it loads the
// configuration again), and the process is made non-dumpable with a core
// file size limit of 0 (see internal/harden).
func Main[C Config](p Program[C]) {
	if err := harden.Restore(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", p.Name, err)
		os.Exit(1)
	}
	ctx, stop := WithShutdownSignals(context.Background(), nil)
	err := run(ctx, p, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, hardenProcess)
	stop()
	code := ExitCode(err)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "%s: %v\n", p.Name, err)
	}
	os.Exit(code)
}
