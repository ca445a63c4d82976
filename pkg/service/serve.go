package service

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// Config is a service's configuration as Serve sees it: a pointer to the
// service's config struct, which embeds Common (the embedding provides the
// method).
type Config interface {
	common() *Common
}

func (c *Common) common() *Common { return c }

// Deps are the resources Serve opens and hands to a service's components.
// Components use them but never close them: Serve does, after every
// component has stopped.
type Deps struct {
	Logger  zerolog.Logger
	DB      *pgxpool.Pool
	Redis   redis.UniversalClient
	Metrics *prometheus.Registry // served on /metrics; register the service's own metrics here
	Admin   *Admin               // for extra readiness checks and endpoints
	// Getenv reads the environment the configuration was read from, for
	// what a service reads later (infra's env: secret references).
	Getenv func(string) string
	// Tracing is the tracer provider (package tracing): OTLP export when
	// an OTEL_EXPORTER_OTLP_* endpoint is set, a no-op otherwise. Serve
	// flushes it after the components stopped.
	Tracing trace.TracerProvider
}

// ComponentsFunc builds a service's long-running parts from what Serve
// opened, in the order RunComponents documents: they are stopped in
// reverse order, so list what feeds work in (stream consumers) last. An
// error (also ctx's, when shutdown is requested while it works) ends
// Serve.
type ComponentsFunc func(ctx context.Context, d Deps) ([]Component, error)

// adminStopTimeout bounds the stop of the admin server when starting fails.
const adminStopTimeout = 5 * time.Second

// Serve runs a service until ctx is done, then shuts it down within
// cfg's SHUTDOWN_GRACE. It returns nil after a requested shutdown, also one
// requested while starting (which it logs as such), and otherwise the error
// that ended it. getenv is handed to the components (Deps.Getenv; nil: an
// empty environment).
//
// Startup order: the admin server first, so /healthz answers while
// migrations wait for their lock (/readyz stays 503 until everything is
// open); then Postgres and its migrations, Redis, the readiness checks of
// both, and the components; /readyz turns ready last.
//
// Shutdown order: /readyz turns 503 as soon as shutdown begins; the
// components stop in reverse order (readers before what they feed); the
// admin server stops last, so /healthz and /metrics answer until the end;
// then Redis and Postgres are closed, once nothing uses them.
func Serve(ctx context.Context, logger zerolog.Logger, cfg Config, getenv func(string) string, components ComponentsFunc) (err error) {
	common := cfg.common()
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	starting := true
	defer func() {
		if starting && err != nil && ctx.Err() != nil {
			logger.Info().Err(err).Msg("shutdown requested while starting")
			err = nil
		}
	}()
	LogConfig(logger, cfg)

	admin, err := NewAdmin(AdminConfig{Addr: common.AdminAddr, Logger: logger, Registry: NewRegistry()})
	if err != nil {
		return err
	}
	if err := admin.Start(ctx); err != nil {
		return err
	}
	defer func() { // when starting fails; a no-op after RunComponents stopped it
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminStopTimeout)
		defer cancel()
		_ = admin.Stop(stopCtx)
	}()

	tp, err := tracing.New(ctx, common.Tracing.Settings(), "autoprovisioner")
	if err != nil {
		return err
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminStopTimeout)
		defer cancel()
		if err := tp.Shutdown(flushCtx); err != nil {
			logger.Warn().Err(err).Msg("flush traces")
		}
	}()
	if common.Tracing.Settings().Enabled() {
		logger.Info().Str("otlp_traces_url", hostOf(common.Tracing.Settings().URL())).Msg("tracing on: spans exported over OTLP/HTTP")
	}

	db, err := openDatabase(ctx, logger, common.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()

	rdb, err := NewRedis(ctx, common.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()

	admin.AddCheck("postgres", db.Ping)
	admin.AddCheck("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })

	parts, err := components(ctx, Deps{Logger: logger, DB: db, Redis: rdb, Metrics: admin.Registry(), Admin: admin, Getenv: getenv, Tracing: tp})
	if err != nil {
		return fmt.Errorf("set up components: %w", err)
	}
	// The admin server comes first: RunComponents stops it last.
	parts = append([]Component{admin.Component()}, parts...)
	admin.MarkReady()
	starting = false
	logger.Info().Str("admin_addr", admin.Addr()).Msg("started")
	if err := RunComponents(ctx, logger, common.ShutdownGrace, parts...); err != nil {
		return err
	}
	logger.Info().Msg("stopped")
	return nil
}

// openDatabase opens the Postgres pool and applies the migrations, logging
// each one and the schema version. Replicas starting together are safe:
// Migrate holds a Postgres advisory lock, the others wait and then find
// nothing to apply.
func openDatabase(ctx context.Context, logger zerolog.Logger, dsn string) (*pgxpool.Pool, error) {
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	applied, err := store.Migrate(ctx, db)
	if err != nil {
		db.Close()
		return nil, err
	}
	for _, m := range applied {
		logger.Info().Int64("version", m.Version).Str("source", m.Source).
			Float64("took_ms", float64(m.Duration.Microseconds())/1000).Msg("migration applied")
	}
	version, err := store.SchemaVersion(ctx, db)
	if err != nil {
		db.Close()
		return nil, err
	}
	logger.Info().Int64("schema_version", version).Int("applied", len(applied)).Msg("database ready")
	return db, nil
}

// hostOf returns scheme://host of a URL, without its credentials, path or
// query, for the log.
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host
}
