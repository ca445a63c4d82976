// Command infra runs Ansible for provisioning and deploy requests from Redis
// Streams. It is configured by environment variables: `infra --help` lists them.
// service.Main hardens the process (secrets out of /proc/<pid>/environ,
// non-dumpable, no core files) once the configuration is loaded.
package main

import (
	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/app"
)

func main() {
	service.Main(service.Program[*app.Config]{
		Name:       app.Name,
		Summary:    app.Summary,
		NewConfig:  app.NewConfig,
		Components: app.Components,
		Secrets:    app.SecretChecks,
	})
}
