// Command deployer is the HTTP front door for deployments. It is configured
// by environment variables: `deployer --help` lists them.
package main

import (
	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/app"
)

func main() {
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
	})
}
