// Package app holds the deployer service: its configuration and its
// Components. service.Serve runs them: it opens the admin server, Postgres
// (with migrations) and Redis, and stops everything in order.
package app

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order. The
// API comes last, so it stops first (no new requests; streams end with a
// retry hint), then the stream consumers, then what they feed (webhook
// deliveries, the event hub, notifications).
func Components(ctx context.Context, cfg *Config, d service.Deps) ([]service.Component, error) {
	parts, err := Build(ctx, cfg, d, Options{})
	if err != nil {
		return nil, err
	}
	return parts.Components(), nil
}
