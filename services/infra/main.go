// Command infra runs Ansible for provisioning and deploy requests from Redis
// Streams. It is configured by environment variables: `infra --help` lists them.
package main

import (
	"fmt"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/app"
)

func main() {
	if err := app.Harden(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: harden: %v\n", app.Name, err)
		os.Exit(1)
	}
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
		Secrets:    app.SecretChecks,
	})
}
