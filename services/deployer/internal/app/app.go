// Package app holds the deployer service: its configuration and its
// Components. service.Serve runs them: it opens the admin server, Postgres
// (with migrations) and Redis, and stops everything in order.
package app

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order, so
// list what feeds work in (stream consumers) last. Features of the service
// add their components here.
func Components(_ context.Context, _ *Config, _ service.Deps) ([]service.Component, error) {
	return nil, nil
}
