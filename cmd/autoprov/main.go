// Command autoprov is the operators' command line of the system: queue and
// consumer state, dead letters, configuration checks. It reads the same
// settings as the services (REDIS_URL, ...), from the environment or an
// --env-file. `autoprov --help` lists the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/cmd/autoprov/internal/cli"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func main() {
	// go-redis logs failed dials on its own; autoprov reports errors itself.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Getenv: os.Getenv, Environ: os.Environ})
	stop()
	os.Exit(code)
}
