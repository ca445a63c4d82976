// Package app holds the scheduler service: its configuration and its
// Components. service.Serve runs them: it opens the admin server, Postgres
// (with migrations) and Redis, and stops everything in order.
package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
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
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/schedules"
)

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order, so
// the results consumer (it feeds the notifications) stops first and the
// secrets last.
//
// Secret references (env:) are read from d.Getenv, the environment the
// configuration came from.
func Components(ctx context.Context, cfg *Config, d service.Deps) ([]service.Component, error) {
	log := d.Logger
	f := fleet.New(d.DB, fleet.Options{})

	redactor := secrets.NewRedactor()
	resolver, err := openSecrets(ctx, cfg, d.Getenv, log, redactor)
	if err != nil {
		return nil, err
	}
	// Projects' credentials (their notification rules') go to backends of
	// their own, never the scheduler's.
	project, err := secrets.OpenProject(ctx, cfg.Project, cfg.Secrets, secrets.Deps{Logger: log, Redactor: redactor, LookupEnv: secrets.LookupIn(d.Getenv)})
	if err != nil {
		resolver.Close()
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
	guard, err := authz.NewGuard(cfg.Special, authz.Options{})
	if err != nil {
		return nil, err
	}
	mgr, err := detect.NewManager(f, detectors, detect.Options{Timeout: cfg.Sources.Timeout,
		MaxOrphanFraction: cfg.Sources.MaxOrphanFraction, Logger: log, Registerer: d.Metrics, Guard: guard})
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
		if err == nil {
			err = usable("SLACK_WEBHOOK_URL_REF", cfg.Notify.SlackWebhookRef, v)
		}
		if err != nil {
			return nil, fmt.Errorf("SLACK_WEBHOOK_URL_REF: %w", err)
		}
		channels = append(channels, notify.NewSlack(v, redactor, cfg.Notify.Timeout))
	}
	if cfg.Notify.TelegramTokenRef != "" {
		v, err := resolve(cfg.Notify.TelegramTokenRef)
		if err == nil {
			err = usable("TELEGRAM_BOT_TOKEN_REF", cfg.Notify.TelegramTokenRef, v)
		}
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
		disp := notify.NewDispatcher(f, ch, ncfg)
		dispatchers = append(dispatchers, disp)
		// A channel that is down does not make the scheduler unready (its
		// notifications wait, nothing is lost): /readyz shows it degraded.
		if d.Admin != nil {
			d.Admin.AddAdvisoryCheck("notify:"+ch.Name(), disp.Health)
		}
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
	handler.Tracing = d.Tracing

	streamMetrics := stream.NewMetrics(d.Metrics)
	sign, err := cfg.Signing.Signer()
	if err != nil {
		return nil, err
	}
	producer := stream.NewProducer(d.Redis, stream.ProducerOptions{Metrics: streamMetrics, Sign: sign})
	relay := reconcile.NewRelay(f, producer, reconcile.RelayConfig{Batch: cfg.Tick.RelayBatch, Logger: log, Registerer: d.Metrics,
		Tracing: d.Tracing})

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
	log.Info().Strs("sources", mgr.Sources()).Int("rules", len(holder.Rules().Rules)).Int("channels", len(channels)).Strs("special_allow_networks", cfg.Special.AllowNetworks).
		Bool("leader_election", leader != nil).Msg("scheduler components ready")

	parts := []service.Component{
		{Name: "secrets", Run: func(ctx context.Context) error {
			if err := resolver.Start(ctx); err != nil {
				return err
			}
			if err := project.Start(ctx); err != nil {
				return err
			}
			<-ctx.Done()
			resolver.Stop()
			project.Stop()
			return errors.Join(project.Close(), resolver.Close())
		}},
		{Name: "rules", Run: holder.Run},
	}
	for i, d := range dispatchers {
		parts = append(parts, service.Component{Name: "notify:" + channels[i].Name(), Run: d.Run})
	}
	// Projects' notification rules: their addresses come from projects,
	// so every connection is checked as a target's would be.
	jobs := notify.NewJobs(d.DB, notify.JobsConfig{Resolve: project.Resolve, Redactor: redactor,
		Net: notify.NewNet(guard.Check, cfg.Notify.Timeout), TelegramAPI: cfg.Notify.TelegramAPI, Logger: log, Metrics: metrics})
	parts = append(parts, service.Component{Name: "notify:jobs", Run: jobs.Run})
	parts = append(parts,
		service.Component{Name: "relay", Run: relay.Run},
		service.Component{Name: "reconcile", Run: loop.Run},
	)
	if cfg.Health.Enabled {
		parts = append(parts, service.Component{Name: "health", Run: checker.Run})
	}
	if cfg.Schedules.Enabled {
		sl, err := schedules.New(d.DB, schedules.Config{Interval: cfg.Schedules.Interval, Batch: cfg.Schedules.Batch,
			Active: func() bool { return leader == nil || leader.Leading() }, Logger: log, Registerer: d.Metrics})
		if err != nil {
			return nil, err
		}
		parts = append(parts, service.Component{Name: "schedules", Run: sl.Run})
	}
	return append(parts, service.Component{Name: "results", Run: consumer.Run}), nil
}
