// Command scheduler keeps the fleet in Postgres in sync with its sources and
// queues provisioning. It is configured by environment variables:
// `scheduler --help` lists them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/app"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/cli"
)

// defaultMemoryLimit is the Go runtime's soft memory limit unless
// GOMEMLIMIT says otherwise: a tick over a large fleet makes short-lived
// garbage, and the limit makes the collector return it instead of letting
// the heap double (see README, Performance).
const defaultMemoryLimit = 128 << 20

func main() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	// The first SIGINT/SIGTERM cancels ctx and the service drains; a second
	// one exits at once with status 130/143.
	ctx, stop := service.WithShutdownSignals(context.Background(), nil)
	err := run(ctx, os.Args[1:], os.Getenv, os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	if err != nil && service.ExitCode(err) != 0 {
		fmt.Fprintf(os.Stderr, "%s: %v\n", app.Name, err)
	}
	os.Exit(service.ExitCode(err))
}

// run parses the command line and the configuration, builds the logger and
// runs the service until ctx is done; `scheduler servers ...` runs an
// operator's command instead (package cli).
func run(ctx context.Context, args []string, getenv func(string) string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "servers" {
		return cli.Run(ctx, args[1:], getenv, stdout, stderr)
	}
	cfg := app.NewConfig()
	if err := service.ParseArgs(args, stdout, app.Name, app.Summary, cfg); err != nil {
		return err // ErrHelp after --help: exit status 0
	}
	if err := service.Load(getenv, cfg); err != nil {
		return err
	}
	logger, err := service.NewLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	logger = logger.With().Str("service", app.Name).Logger()
	return app.Run(ctx, logger, cfg, lookupEnv)
}
