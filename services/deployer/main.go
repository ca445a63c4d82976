// Command deployer is the HTTP front door for deployments. It is configured
// by environment variables: `deployer --help` lists them. `deployer keys
// ...` manages API keys.
package main

import (
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/app"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "keys" {
		app.KeysMain(os.Args[2:])
	}
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
		Commands: []service.Command{
			{Name: "keys", Summary: "manage the API's keys in DATABASE_URL: create, list, revoke (deployer keys --help)"},
		},
	})
}
