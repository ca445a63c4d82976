// Command scheduler keeps the fleet in Postgres in sync with its sources and
// queues provisioning. It is configured by environment variables:
// `scheduler --help` lists them.
package main

import (
	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/app"
)

func main() {
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
	})
}
