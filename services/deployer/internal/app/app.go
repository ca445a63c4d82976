// Package app holds the deployer service: its configuration and Run, which
// opens what the service needs and runs its components until shutdown.
package app

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Deps are the resources Run opens and hands to the service's components.
// Components use them but never close them: Run does, after every
// component has stopped.
type Deps struct {
	Config  *Config
	Logger  zerolog.Logger
	DB      *pgxpool.Pool
	Redis   redis.UniversalClient
	Metrics *prometheus.Registry
	Admin   *service.Admin // for extra readiness checks and endpoints
	// Streams replaces the wire contract's stream names (tests); zero
	// means the defaults.
	Streams deployments.Streams
	// Resolver resolves webhook host names; nil means the system's.
	Resolver *net.Resolver
}

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order. The
// API comes last, so it stops first (no new requests; streams end with a
// retry hint), then the stream consumers, then what they feed (webhook
// deliveries, the event hub, notifications).
func Components(ctx context.Context, d Deps) ([]service.Component, error) {
	parts, err := Build(ctx, d)
	if err != nil {
		return nil, err
	}
	return parts.Components(), nil
}

// Run runs the service until ctx is done, then shuts it down within
// cfg.ShutdownGrace. It returns nil after a requested shutdown (also one
// requested while starting).
//
// Startup order: the admin server first, so /healthz answers while
// migrations wait for their lock (/readyz stays 503 until everything is
// open), then Postgres and its migrations, Redis, and the components.
//
// Shutdown order: /readyz turns 503 as soon as shutdown begins; the
// components stop in reverse order (readers before what they feed); the
// admin server stops last, so /healthz and /metrics answer until the end;
// then Redis and Postgres are closed (deferred), once nothing uses them.
func Run(ctx context.Context, logger zerolog.Logger, cfg *Config) (err error) {
	starting := true
	defer func() {
		if starting && err != nil && ctx.Err() != nil {
			logger.Info().Err(err).Msg("shutdown requested while starting")
			err = nil
		}
	}()
	service.LogConfig(logger, cfg)

	admin, err := service.NewAdmin(service.AdminConfig{Addr: cfg.AdminAddr, Logger: logger, Registry: service.NewRegistry()})
	if err != nil {
		return err
	}
	if err := admin.Start(ctx); err != nil {
		return err
	}
	defer func() { // when starting fails; a no-op after RunComponents stopped it
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = admin.Stop(stopCtx)
	}()

	db, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	// Replicas starting together are safe: Migrate holds a Postgres
	// advisory lock, the others wait and then find nothing to apply.
	applied, err := store.Migrate(ctx, db)
	if err != nil {
		return err
	}
	for _, m := range applied {
		logger.Info().Int64("version", m.Version).Str("source", m.Source).
			Float64("took_ms", float64(m.Duration.Microseconds())/1000).Msg("migration applied")
	}
	version, err := store.SchemaVersion(ctx, db)
	if err != nil {
		return err
	}
	logger.Info().Int64("schema_version", version).Int("applied", len(applied)).Msg("database ready")

	rdb, err := service.NewRedis(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	admin.AddCheck("postgres", db.Ping)
	admin.AddCheck("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })

	parts, err := Components(ctx, Deps{Config: cfg, Logger: logger, DB: db, Redis: rdb, Metrics: admin.Registry(), Admin: admin})
	if err != nil {
		return fmt.Errorf("set up components: %w", err)
	}
	// The admin server comes first: RunComponents stops it last.
	parts = append([]service.Component{admin.Component()}, parts...)
	admin.MarkReady()
	starting = false
	logger.Info().Str("admin_addr", admin.Addr()).Msg("started")
	err = service.RunComponents(ctx, logger, cfg.ShutdownGrace, parts...)
	if err != nil {
		return err
	}
	logger.Info().Msg("stopped")
	return nil
}
