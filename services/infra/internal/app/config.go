package app

import "github.com/autoprovisioner/autoprovisioner/pkg/service"

// Name is the service's name in logs, metrics and --help.
const Name = "infra"

// Summary is the one-line description --help prints.
const Summary = "runs Ansible for provisioning and deploy requests from Redis Streams"

// DefaultAdminAddr is where the admin server listens unless ADMIN_ADDR says otherwise.
const DefaultAdminAddr = "127.0.0.1:9102"

// Config is the configuration of the service, read from the environment by
// service.Load. Settings of the service's own features go next to Common,
// with `env`, `envDefault` and `desc` tags; a Validate method on Config
// checks them (Load validates Common by itself).
type Config struct {
	service.Common
}

// NewConfig returns a Config holding the service's own defaults, ready for
// service.Load and service.Usage.
func NewConfig() *Config {
	return &Config{Common: service.Common{AdminAddr: DefaultAdminAddr}}
}
