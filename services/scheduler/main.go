// Command scheduler keeps the fleet in Postgres in sync with its sources and
// queues provisioning. It is configured by environment variables:
// `scheduler --help` lists them; `scheduler servers --help` lists the
// operators' commands.
package main

import (
	"os"
	"runtime/debug"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/app"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/cli"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == cli.Command {
		cli.Main(os.Args[2:])
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(app.DefaultMemoryLimit)
	}
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
		Secrets:    app.SecretChecks,
		Commands:   []service.Command{{Name: cli.Command, Summary: cli.Summary}},
	})
}
