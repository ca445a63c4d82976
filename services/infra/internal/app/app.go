// Package app holds the infra service: its configuration and its
// Components. service.Serve runs them: it opens the admin server, Postgres
// (with migrations) and Redis, and stops everything in order.
package app

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/signing"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// Components returns the service's long-running parts, in the order
// service.RunComponents documents: they are stopped in reverse order, so
// the stream consumer, which feeds the handlers, comes last and stops first.
// env: secret references are read from d.Getenv, the environment the
// configuration came from.
func Components(ctx context.Context, cfg *Config, d service.Deps) ([]service.Component, error) {
	log := d.Logger

	redactor := secrets.NewRedactor()
	resolver, err := openOwnSecrets(ctx, cfg, d.Getenv, log, redactor)
	if err != nil {
		return nil, err
	}
	// The references requests carry go to backends of their own: another
	// Vault login (a policy of project paths only), another env prefix and
	// file root, each off unless configured.
	project, err := secrets.OpenProject(ctx, cfg.Project, cfg.Secrets, secrets.Deps{Logger: log, Redactor: redactor, LookupEnv: secrets.LookupIn(d.Getenv)})
	if err != nil {
		resolver.Close()
		return nil, err
	}
	authorizer, err := authz.New(cfg.Authz, authz.Options{})
	if err != nil {
		return nil, err
	}
	// Producer keys are the service's own secrets; the check runs before a
	// request reaches the handler.
	sigChecker, err := signing.New(ctx, cfg.Signing, resolver.Resolve, log)
	if err != nil {
		return nil, err
	}
	keySpecs, _ := cfg.Signing.ParseKeys() // validated with the config
	ownRefs := signingRefs(keySpecs)

	runAs, err := cfg.Playbook.RunAs()
	if err != nil {
		return nil, err
	}
	sandbox, err := cfg.Playbook.SandboxConfig()
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
		RunAs:        runAs,
		Clean:        cleanScopes(cfg.Playbook.TakeoverAlways, d.DB),
		WarmIdle:     cfg.SSH.WarmIdleOrOff(),
		Sandbox:      sandbox,
	}, log)
	if err != nil {
		return nil, err
	}
	jobs.RegisterWarmConnections(d.Metrics, runner.WarmConnections)
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
		Factor:         cfg.SSH.DelayFactor,
		Jitter:         cfg.SSH.DelayJitter,
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
	runLogs, err := runlog.Open(ctx, cfg.RunLog, d.DB)
	if err != nil {
		return nil, err
	}
	handler, err := jobs.New(jobs.Config{
		Owner:            consumerName,
		ElsewhereRecheck: cfg.Stream.RetryBackoff,
		BusyRecheck:      cfg.Jobs.BusyRecheck,
		BehindRecheck:    min(5*time.Second, cfg.Stream.Lease/4),
		OutageWait:       cfg.Jobs.OutageWait,
		LockLease:        cfg.Jobs.LockLease,
		RedisOutageWait:  cfg.Jobs.RedisOutageWait,
		Playbooks:        jobs.DefaultPlaybooks,
		PlaybookDir:      filepath.Join(cfg.Playbook.Dir, "playbooks"),
		DefaultSSHKeyRef: cfg.SSH.KeyRef,
		OwnRefs:          ownRefs,
		DeploySSHUser:    cfg.SSH.DeployUser,
		MaxDeliveries:    cfg.Stream.MaxDeliveries,
		CancelPoll:       cfg.Jobs.CancelPoll,
		ProgressTTL:      cfg.Jobs.ProgressTTL,
		ReinstallOS:      cfg.Jobs.ReinstallOS,
		ReinstallSSHWait: cfg.Jobs.ReinstallSSHWait,
		SSHCheckReuse:    cfg.SSH.CheckReuse,
		SSHCheckShared:   cfg.SSH.CheckReuseShared,
		Limits:           limits,
		SiteVars:         siteVars,
	}, jobs.Deps{
		DB:       d.DB,
		Locker:   locker,
		Redis:    d.Redis,
		Producer: stream.NewProducer(d.Redis, stream.ProducerOptions{Metrics: streamMetrics, OutageWait: cfg.Jobs.RedisOutageWait}),
		Secrets:  resolver,
		Project:  project,
		Authz:    authorizer,
		Redactor: redactor,
		SSH:      checker,
		Runner:   runner,
		Provider: provider,
		RunLogs:  runLogs,
		Log:      log,
		Metrics:  jobs.NewMetrics(d.Metrics),
		Tracing:  d.Tracing,
	})
	if err != nil {
		return nil, err
	}
	jobStreams, err := serveAnsibleJobs(cfg, handler, authorizer.Guard(), runner, log)
	if err != nil {
		return nil, err
	}
	drainGrace, short := cfg.DrainGrace()
	if short {
		log.Warn().Dur("shutdown_grace", cfg.ShutdownGrace).Dur("cancel_grace", cfg.CancelGrace()).
			Msg("SHUTDOWN_GRACE leaves running requests almost no time to finish at shutdown: make it longer than PLAYBOOK_KILL_GRACE + 6s")
	}
	consumer, err := stream.NewConsumer(d.Redis, stream.Config{
		Group:         cfg.Stream.Group,
		Streams:       append([]string{messages.StreamProvisionerQueue, messages.StreamAnsibleDeployQueue}, jobStreams...),
		Consumer:      consumerName,
		Concurrency:   cfg.Stream.Concurrency,
		Lease:         cfg.Stream.Lease,
		MaxDeliveries: cfg.Stream.MaxDeliveries,
		RetryBackoff:  cfg.Stream.RetryBackoff,
		// Both graces fit in SHUTDOWN_GRACE: see Config.DrainGrace.
		ShutdownGrace: drainGrace,
		CancelGrace:   cfg.CancelGrace(),
		Logger:        log,
		Metrics:       streamMetrics,
		// Handler errors may quote what a job resolved.
		Redact: redactor.RedactString,
	}, sigChecker.Handler(handler))
	if err != nil {
		return nil, err
	}
	log.Info().Str("consumer", consumerName).Bool("runguard", runner.Guarded()).
		Bool("time4vps", provider != nil).Str("playbook_user", cfg.Playbook.User).Bool("ssh_warm_connections", cfg.SSH.WarmConnections).Str("request_signatures", cfg.Signing.Mode).Int("producer_keys", len(keySpecs)).
		Strs("deploy_allow_networks", cfg.Authz.AllowNetworks).Strs("deploy_secret_refs", authorizer.Templates()).
		Msg("infra components ready")

	if cfg.SSH.WarmConnections && len(jobStreams) > 0 {
		log.Warn().Msg("SSH_WARM_CONNECTIONS with Ansible jobs served: a job's code runs as the same play user and could use a warm SSH connection while it lives (docs/infra.md)")
	}
	return []service.Component{
		// Stopped last: the warm SSH connections close once no run is left.
		{Name: "ssh-masters", Run: func(ctx context.Context) error {
			<-ctx.Done()
			runner.Close()
			return nil
		}},
		{Name: "secrets", Run: func(ctx context.Context) error {
			if err := resolver.Start(ctx); err != nil {
				return err
			}
			if err := project.Start(ctx); err != nil {
				resolver.Stop()
				return err
			}
			<-ctx.Done()
			project.Stop()
			resolver.Stop()
			return errors.Join(project.Close(), resolver.Close())
		}},
		{Name: "locks", Run: func(ctx context.Context) error {
			<-ctx.Done() // stops after the consumer: no run holds a session then
			locker.Close()
			return nil
		}},
		{Name: "prepared-jobs", Run: func(ctx context.Context) error {
			<-ctx.Done() // stops after the consumer: no job looks again then
			handler.DropPrepared()
			return nil
		}},
		{Name: "consumer", Run: consumer.Run},
	}, nil
}

// cleanScopes are the runner's clean marks in Postgres, or none (every play
// takes over) with PLAYBOOK_TAKEOVER_ALWAYS.
func cleanScopes(always bool, db store.Querier) ansible.CleanScopes {
	if always {
		return nil
	}
	return store.CleanScopes{DB: db}
}
