// Package app holds the infra service: its configuration and Run, which
// opens what the service needs and runs its components until shutdown.
package app

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
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
	// LookupEnv reads the process environment, for env: secret references.
	LookupEnv func(string) (string, bool)
}

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order, so
// the stream consumer, which feeds the handlers, comes last and stops first.
func Components(ctx context.Context, d Deps) ([]service.Component, error) {
	cfg := d.Config
	log := d.Logger

	redactor := secrets.NewRedactor()
	resolver, err := secrets.Open(ctx, cfg.Secrets, secrets.Deps{Logger: log, Redactor: redactor, LookupEnv: d.LookupEnv})
	if err != nil {
		return nil, err
	}

	runner, err := ansible.New(ansible.Config{
		AnsibleDir:   cfg.Playbook.Dir,
		PlaybookBin:  cfg.Playbook.Bin,
		RunRoot:      cfg.Playbook.RunRoot,
		GuardPath:    cfg.Playbook.Guard,
		KillGrace:    cfg.Playbook.KillGrace,
		Timeout:      cfg.Playbook.Timeout,
		IdleTimeout:  cfg.Playbook.IdleTimeout,
		FactCacheDir: cfg.Playbook.FactCache,
	}, log)
	if err != nil {
		return nil, err
	}
	if n, err := runner.SweepLeftovers(); err != nil {
		log.Warn().Err(err).Msg("sweeping leftover run directories failed")
	} else if n > 0 {
		log.Warn().Int("removed", n).Msg("removed run directories left by a crashed run")
	}

	sshMetrics, err := sshcheck.NewPrometheusMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	checker, err := sshcheck.New(sshcheck.Config{
		Attempts:       cfg.SSH.Attempts,
		BaseDelay:      cfg.SSH.BaseDelay,
		MaxDelay:       cfg.SSH.MaxDelay,
		AttemptTimeout: cfg.SSH.AttemptTimeout,
		Policy:         cfg.SSH.HostKeyPolicy,
	}, log, sshcheck.WithMetrics(sshMetrics))
	if err != nil {
		return nil, err
	}

	var provider jobs.Provider
	if cfg.Time4VPS.Username != "" {
		client, err := time4vps.New(cfg.Time4VPS, log)
		if err != nil {
			return nil, err
		}
		provider = client
	}

	limits, err := cfg.Playbook.Limits()
	if err != nil {
		return nil, err
	}
	siteVars, err := cfg.Playbook.SiteVars()
	if err != nil {
		return nil, err
	}
	// One lock session per concurrent run, kept between runs.
	locker := store.NewLocker(d.DB, cfg.Stream.Concurrency)
	consumerName := cfg.Stream.ConsumerName
	if consumerName == "" {
		consumerName = stream.DefaultConsumerName()
	}
	streamMetrics := stream.NewMetrics(d.Metrics)
	handler, err := jobs.New(jobs.Config{
		Owner:            consumerName,
		Playbooks:        jobs.DefaultPlaybooks,
		DefaultSSHKeyRef: cfg.SSH.KeyRef,
		DeploySSHUser:    cfg.SSH.DeployUser,
		MaxDeliveries:    cfg.Stream.MaxDeliveries,
		CancelPoll:       cfg.Jobs.CancelPoll,
		ProgressTTL:      cfg.Jobs.ProgressTTL,
		ReinstallOS:      cfg.Jobs.ReinstallOS,
		ReinstallSSHWait: cfg.Jobs.ReinstallSSHWait,
		SSHCheckReuse:    cfg.SSH.CheckReuse,
		Limits:           limits,
		SiteVars:         siteVars,
	}, jobs.Deps{
		DB:       d.DB,
		Locker:   locker,
		Redis:    d.Redis,
		Producer: stream.NewProducer(d.Redis, stream.ProducerOptions{Metrics: streamMetrics}),
		Secrets:  resolver,
		Redactor: redactor,
		SSH:      checker,
		Runner:   runner,
		Provider: provider,
		Log:      log,
		Metrics:  jobs.NewMetrics(d.Metrics),
	})
	if err != nil {
		return nil, err
	}
	consumer, err := stream.NewConsumer(d.Redis, stream.Config{
		Group:         cfg.Stream.Group,
		Streams:       []string{messages.StreamProvisionerQueue, messages.StreamAnsibleDeployQueue},
		Consumer:      consumerName,
		Concurrency:   cfg.Stream.Concurrency,
		Lease:         cfg.Stream.Lease,
		MaxDeliveries: cfg.Stream.MaxDeliveries,
		RetryBackoff:  cfg.Stream.RetryBackoff,
		ShutdownGrace: cfg.ShutdownGrace,
		// Cancelled plays get SIGTERM, then SIGKILL after the kill grace.
		CancelGrace: cfg.Playbook.KillGrace + 5*time.Second,
		Logger:      log,
		Metrics:     streamMetrics,
	}, handler)
	if err != nil {
		return nil, err
	}
	log.Info().Str("consumer", consumerName).Bool("runguard", runner.Guarded()).
		Bool("time4vps", provider != nil).Msg("infra components ready")

	return []service.Component{
		{Name: "secrets", Run: func(ctx context.Context) error {
			if err := resolver.Start(ctx); err != nil {
				return err
			}
			<-ctx.Done()
			resolver.Stop()
			return resolver.Close()
		}},
		{Name: "locks", Run: func(ctx context.Context) error {
			<-ctx.Done() // stops after the consumer: no run holds a session then
			locker.Close()
			return nil
		}},
		{Name: "consumer", Run: consumer.Run},
	}, nil
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
//
// getenv reads the process environment for env: secret references.
func Run(ctx context.Context, logger zerolog.Logger, cfg *Config, getenv func(string) string) (err error) {
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

	lookupEnv := func(name string) (string, bool) {
		v := getenv(name)
		return v, v != ""
	}
	parts, err := Components(ctx, Deps{Config: cfg, Logger: logger, DB: db, Redis: rdb, Metrics: admin.Registry(), Admin: admin, LookupEnv: lookupEnv})
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
