// Package app holds the scheduler service: its configuration and Run, which
// opens what the service needs and runs its components until shutdown.
package app

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/inventory"
	dt4v "github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/health"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/reconcile"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/results"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
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
// the results consumer (it feeds the notifications) stops first and the
// secrets last.
func Components(ctx context.Context, d Deps) ([]service.Component, error) {
	cfg, log := d.Config, d.Logger
	f := fleet.New(d.DB, fleet.Options{})

	redactor := secrets.NewRedactor()
	resolver, err := secrets.Open(ctx, cfg.Secrets, secrets.Deps{Logger: log, Redactor: redactor, LookupEnv: d.LookupEnv})
	if err != nil {
		return nil, err
	}
	resolve := func(ref string) (secrets.Value, error) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return resolver.Resolve(rctx, ref)
	}

	holder, err := rules.NewHolder(cfg.Rules.File, filepath.Join(cfg.Rules.PlaybookDir, "playbooks"), log, d.Metrics)
	if err != nil {
		return nil, err
	}

	var detectors []detect.Detector
	for _, path := range cfg.Sources.Inventories {
		inv, err := inventory.New(path, cfg.Sources.InventoryBin)
		if err != nil {
			return nil, err
		}
		detectors = append(detectors, inv)
	}
	if cfg.Sources.Time4VPS && cfg.Time4VPS.Username != "" {
		client, err := time4vps.New(cfg.Time4VPS, log)
		if err != nil {
			return nil, err
		}
		detectors = append(detectors, dt4v.New(client, ""))
	}
	if cfg.EC2.Region != "" {
		tags, _ := ec2.ParseTags(cfg.EC2.Tags) // validated
		ec2cfg := ec2.Config{Region: cfg.EC2.Region, Endpoint: cfg.EC2.Endpoint, Tags: tags, Address: cfg.EC2.Address,
			SSHUser: cfg.EC2.SSHUser, PageSize: cfg.EC2.PageSize, AccessKeyID: cfg.EC2.AccessKeyID}
		if cfg.EC2.SecretKeyRef != "" {
			v, err := resolve(cfg.EC2.SecretKeyRef)
			if err != nil {
				return nil, fmt.Errorf("EC2_SECRET_ACCESS_KEY_REF: %w", err)
			}
			ec2cfg.SecretAccessKey = v.Reveal()
		}
		det, err := ec2.New(ctx, ec2cfg)
		if err != nil {
			return nil, err
		}
		detectors = append(detectors, det)
	}
	mgr, err := detect.NewManager(f, detectors, detect.Options{Timeout: cfg.Sources.Timeout,
		MaxOrphanFraction: cfg.Sources.MaxOrphanFraction, Logger: log, Registerer: d.Metrics})
	if err != nil {
		return nil, err
	}

	// Notifications: each channel is registered before anything can change
	// a server, so no change of this run is missed.
	metrics := notify.NewMetrics(d.Metrics)
	ncfg := notify.Config{DigestThreshold: cfg.Notify.DigestThreshold, Logger: log, Metrics: metrics,
		Hints: notify.Hints{UnreachableCooldown: cfg.Retry.UnreachableCooldown}}
	var channels []notify.Channel
	if cfg.Notify.SlackWebhookRef != "" {
		v, err := resolve(cfg.Notify.SlackWebhookRef)
		if err != nil {
			return nil, fmt.Errorf("SLACK_WEBHOOK_URL_REF: %w", err)
		}
		channels = append(channels, notify.NewSlack(v, redactor, cfg.Notify.Timeout))
	}
	if cfg.Notify.TelegramTokenRef != "" {
		v, err := resolve(cfg.Notify.TelegramTokenRef)
		if err != nil {
			return nil, fmt.Errorf("TELEGRAM_BOT_TOKEN_REF: %w", err)
		}
		channels = append(channels, notify.NewTelegram(cfg.Notify.TelegramAPI, v, cfg.Notify.TelegramChat, redactor, cfg.Notify.Timeout))
	}
	var dispatchers []*notify.Dispatcher
	for _, ch := range channels {
		if err := f.EnsureChannel(ctx, ch.Name()); err != nil {
			return nil, err
		}
		dispatchers = append(dispatchers, notify.NewDispatcher(f, ch, ncfg))
	}
	wakeNotify := func() {
		for _, d := range dispatchers {
			d.Wake()
		}
	}

	policy := results.Policy{RetryLimit: cfg.Retry.Limit, Backoff: cfg.Retry.Backoff, MaxBackoff: cfg.Retry.MaxBackoff,
		UnreachableCooldown: cfg.Retry.UnreachableCooldown}
	handler := results.New(f, holder.Rules, policy, log, d.Metrics)
	handler.Applied = wakeNotify

	streamMetrics := stream.NewMetrics(d.Metrics)
	producer := stream.NewProducer(d.Redis, stream.ProducerOptions{Metrics: streamMetrics})
	relay := reconcile.NewRelay(f, producer, reconcile.RelayConfig{Batch: cfg.Tick.RelayBatch, Logger: log, Registerer: d.Metrics})

	var leader *reconcile.Leader
	if cfg.Tick.LeaderElection {
		leader = reconcile.NewLeader(d.DB, "scheduler")
	}
	loop := reconcile.New(f, mgr, holder.Rules, handler, reconcile.Config{
		Interval: cfg.Tick.Interval, Batch: cfg.Tick.Batch, StuckAfter: cfg.Tick.StuckAfter,
		Leader: leader, Logger: log, Registerer: d.Metrics, Wake: relay.Wake(),
	})
	checker := health.New(f, holder.Rules, health.Config{
		Interval: cfg.Health.Interval, Concurrency: cfg.Health.Concurrency, Timeout: cfg.Health.Timeout,
		Failures: cfg.Health.Failures, Cooldown: cfg.Health.RecoveryCooldown, Logger: log, Registerer: d.Metrics,
		Active: func() bool { return leader == nil || leader.Leading() }, Flagged: loop.Kick,
	})

	consumerName := cfg.Results.ConsumerName
	if consumerName == "" {
		consumerName = stream.DefaultConsumerName()
	}
	consumer, err := stream.NewConsumer(d.Redis, stream.Config{
		Group: results.Group, Streams: []string{messages.StreamProvisionerResults}, Consumer: consumerName,
		Concurrency: cfg.Results.Concurrency, ShutdownGrace: cfg.ShutdownGrace, Logger: log, Metrics: streamMetrics,
	}, handler)
	if err != nil {
		return nil, err
	}
	log.Info().Strs("sources", mgr.Sources()).Int("rules", len(holder.Rules().Rules)).Int("channels", len(channels)).
		Bool("leader_election", leader != nil).Msg("scheduler components ready")

	parts := []service.Component{
		{Name: "secrets", Run: func(ctx context.Context) error {
			if err := resolver.Start(ctx); err != nil {
				return err
			}
			<-ctx.Done()
			resolver.Stop()
			return resolver.Close()
		}},
		{Name: "rules", Run: holder.Run},
	}
	for i, d := range dispatchers {
		parts = append(parts, service.Component{Name: "notify:" + channels[i].Name(), Run: d.Run})
	}
	parts = append(parts,
		service.Component{Name: "relay", Run: relay.Run},
		service.Component{Name: "reconcile", Run: loop.Run},
	)
	if cfg.Health.Enabled {
		parts = append(parts, service.Component{Name: "health", Run: checker.Run})
	}
	return append(parts, service.Component{Name: "results", Run: consumer.Run}), nil
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
// lookupEnv reads the process environment for env: secret references.
func Run(ctx context.Context, logger zerolog.Logger, cfg *Config, lookupEnv func(string) (string, bool)) (err error) {
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
