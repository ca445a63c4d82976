package app

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/observer"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/publishing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// Options are what tests change in a deployer built by Build; the zero
// value is the service's own.
type Options struct {
	// Streams replaces the wire contract's stream names; zero means the
	// defaults.
	Streams deployments.Streams
	// Resolver resolves webhook host names; nil means the system's.
	Resolver *net.Resolver
}

// Parts are the service's built components.
type Parts struct {
	API         *api.API
	closers     []func() error // close what Build opened for the web console
	Deployments *deployments.Service
	Notifier    *deployments.Notifier
	Hub         *events.Hub
	Deliverer   *webhooks.Deliverer // nil when webhooks are disabled
	Results     *stream.Consumer
	Publisher   *publishing.Publisher
	Observer    *observer.Observer // nil when OBSERVE_QUEUE is off
	Logs        runlog.Store
	Credentials *credentials.Service
	Templates   *templates.Service
	// Launcher launches schedule occurrences (nil when
	// SCHEDULE_LAUNCH_WORKERS is 0).
	Launcher *templates.Launcher
	// Workflows are the workflows; WorkflowEngine advances their runs.
	Workflows      *workflows.Service
	WorkflowEngine *workflows.Engine
	// vault writes credential values (nil without CREDENTIALS_VAULT_ADDR).
	vault *secrets.Vault
	cfg   *Config
	log   zerolog.Logger
}

// Build builds the components from the configuration and what Serve
// opened (d), changed by o (tests).
func Build(ctx context.Context, cfg *Config, d service.Deps, o Options) (*Parts, error) {
	log := d.Logger
	streams := o.Streams
	if streams == (deployments.Streams{}) {
		streams = deployments.DefaultStreams()
	}
	if streams.JobQueue == "" || streams.JobResults == "" {
		def := deployments.DefaultStreams()
		streams.JobQueue, streams.JobResults = cmp.Or(streams.JobQueue, def.JobQueue), cmp.Or(streams.JobResults, def.JobResults)
	}
	p := &Parts{cfg: cfg, log: log}

	logs, err := runlog.Open(ctx, cfg.RunLog, d.DB)
	if err != nil {
		return nil, err
	}
	p.Logs = logs

	signingKey, err := cfg.Webhooks.SigningKeyBytes()
	if err != nil {
		return nil, err
	}
	allow, err := webhooks.ParseCIDRs(cfg.Webhooks.AllowCIDRs)
	if err != nil {
		return nil, err
	}
	guard := webhooks.NewGuard(allow)

	refs, err := cfg.SecretRefs.Authorizer()
	if err != nil {
		return nil, err
	}
	pools, err := cfg.Pools.Pools()
	if err != nil {
		return nil, err
	}
	// This host's own addresses are infra's business: none here.
	special, err := authz.NewGuard(cfg.Special, authz.Options{InterfaceAddrs: func() ([]net.Addr, error) { return nil, nil }})
	if err != nil {
		return nil, err
	}
	ccfg := credentials.Config{Refs: refs, Mount: cfg.Credentials.Mount, Path: cfg.Credentials.Path}
	if cfg.Credentials.Vault.Addr != "" {
		p.vault, err = secrets.NewVault(ctx, cfg.Credentials.Vault, secrets.VaultOptions{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("credentials vault: %w", err)
		}
		ccfg.Vault = p.vault
	}
	p.Credentials = credentials.NewService(d.DB, ccfg)
	p.Notifier = deployments.NewNotifier(d.Redis, "deployer:finished", log)
	dcfg := deployments.Config{Streams: streams, CancelTTL: cfg.Stream.CancelTTL, WebhookRetryFor: cfg.Webhooks.RetryFor,
		IdempotencyTTL: cfg.Keep.IdempotencyKeys, Tracing: d.Tracing, SecretRefs: refs, Credentials: p.Credentials, Pools: pools,
		Special: special}
	if signingKey != nil {
		p.Deliverer, err = webhooks.NewDeliverer(d.DB, webhooks.Config{
			SigningKey: signingKey, Client: guard.NewClient(webhooks.ClientOptions{Timeout: cfg.Webhooks.Timeout, Resolver: o.Resolver}),
			Workers: cfg.Webhooks.Workers, Lease: cfg.Webhooks.Lease, BackoffMin: cfg.Webhooks.BackoffMin,
			BackoffMax: cfg.Webhooks.BackoffMax, Logger: log, Registerer: d.Metrics,
		})
		if err != nil {
			return nil, err
		}
		dcfg.CheckCallback = guard.CheckURL
		dcfg.OnWebhook = p.Deliverer.Notify
	}
	sign, err := cfg.Signing.Signer()
	if err != nil {
		return nil, err
	}
	producer := stream.NewProducer(d.Redis, stream.ProducerOptions{Sign: sign})
	p.Publisher, err = publishing.New(d.DB, producer, publishing.Config{Queue: streams.Queue, Tracing: d.Tracing}, log, d.Metrics)
	if err != nil {
		return nil, err
	}
	p.Deployments, err = deployments.New(d.DB, stream.NewJobs(d.Redis), p.Publisher, p.Notifier, dcfg, log, d.Metrics)
	if err != nil {
		return nil, err
	}
	p.Hub = events.NewHub(stream.NewJobs(d.Redis), events.HubConfig{Logger: log})

	streamMetrics := stream.NewMetrics(d.Metrics)
	p.Results, err = stream.NewConsumer(d.Redis, stream.Config{
		Group: cfg.Stream.Group, Streams: []string{streams.Results, streams.JobResults}, Consumer: cfg.Stream.ConsumerName,
		Concurrency: cfg.Stream.Concurrency, ShutdownGrace: 10 * time.Second, Logger: log, Metrics: streamMetrics,
	}, resultsHandler(streams, p.Deployments))
	if err != nil {
		return nil, err
	}
	if cfg.Stream.ObserveQueue {
		p.Observer = observer.New(d.Redis, streams.Queue, d.DB, p.Publisher, log)
	}

	keys := auth.NewStore(d.DB)
	authn := auth.NewAuthenticator(keys, cfg.API.KeyCacheTTL)
	p.Templates = p.templates(d)
	if cfg.ScheduleLaunchWorkers > 0 {
		p.Launcher, err = templates.NewLauncher(d.DB, p.Templates, p.Deployments, keys, templates.LauncherConfig{
			Workers: cfg.ScheduleLaunchWorkers, Lease: cfg.ScheduleLaunchLease, Logger: log, Registerer: d.Metrics})
		if err != nil {
			return nil, err
		}
	}
	p.Workflows = workflows.NewService(d.DB, p.Templates)
	p.WorkflowEngine, err = workflows.NewEngine(p.Workflows, p.Deployments, p.Deployments, keys, workflows.EngineConfig{
		Poll: cfg.WorkflowPoll, Logger: log, Registerer: d.Metrics})
	if err != nil {
		return nil, err
	}
	var secretFn func(string) string
	if signingKey != nil {
		secretFn = func(keyID string) string { return webhooks.DeriveSecret(signingKey, keyID) }
	}
	apiTLS, err := cfg.API.TLS()
	if err != nil {
		return nil, err
	}
	p.API, err = api.New(api.Config{
		TLS:  apiTLS,
		Addr: cfg.API.Addr, MaxBody: cfg.API.MaxBody, MaxWait: cfg.API.MaxWait, AuthFailureRate: cfg.API.AuthFailureRate,
		Rates:         auth.RateDefaults{Rate: cfg.API.RateLimit, Burst: cfg.API.RateBurst},
		Events:        events.StreamConfig{Heartbeat: cfg.API.SSEHeartbeat, Retry: cfg.API.SSERetry},
		ShutdownGrace: cfg.ShutdownGrace / 2,
	}, api.Deps{
		Deployments: p.Deployments, Credentials: p.Credentials, Templates: p.Templates, Keys: keys,
		Triggers:      templates.NewTriggers(p.Templates, p.Deployments, keys, signingKey),
		Notifications: templates.NewNotifications(p.Templates, p.Credentials, guard.CheckURL),
		Workflows:     p.Workflows,
		Auth:          authn, Forget: authn.Forget,
		Limiter: auth.NewLimiter(d.Redis, auth.RateKeyPrefix, cfg.API.RateLimit, cfg.API.RateBurst),
		Hub:     p.Hub, Logs: logs,
		Webhooks: func(ctx context.Context, id string) ([]webhooks.Delivery, error) {
			return webhooks.ListForDeployment(ctx, d.DB, id)
		},
		WebhookSecret: secretFn,
		Fleet:         fleet.New(d.DB, fleet.Options{}),
		Queues:        stream.NewInspector(d.Redis), JobPools: pools.Names(),
		Logger: log, Registerer: d.Metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if d.Admin != nil {
		// /readyz says ready only once API_ADDR is served: a client (or a
		// load balancer) that waits for it then finds the API there.
		d.Admin.AddCheck("api", p.API.Listening)
	}
	if cfg.Console.Enabled {
		if err := p.buildConsole(ctx, d, streams, authn, keys, apiTLS != nil); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// templates builds the job templates' service: secret answers go to the
// credentials' Vault (CREDENTIALS_VAULT_ADDR), under the same mount.
func (p *Parts) templates(d service.Deps) *templates.Service {
	cfg := templates.Config{Check: p.Deployments, Mount: p.cfg.Credentials.Mount, Path: p.cfg.Credentials.LaunchPath}
	if p.vault != nil {
		cfg.Vault = p.vault
	}
	return templates.NewService(d.DB, cfg)
}

// resultsHandler records the results of deploy:results and job:results.
func resultsHandler(streams deployments.Streams, svc *deployments.Service) stream.Handler {
	deploys, jobs := svc.ResultsHandler(), svc.JobResultsHandler()
	return stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		if msg.Stream == streams.JobResults {
			return jobs.Handle(ctx, msg)
		}
		return deploys.Handle(ctx, msg)
	})
}

// Components lists the parts in start order (stopped in reverse).
func (p *Parts) Components() []service.Component {
	parts := []service.Component{
		{Name: "notifier", Run: p.Notifier.Run},
		{Name: "events", Run: p.Hub.Run},
		{Name: "retention", Run: p.retention},
	}
	if p.vault != nil {
		parts = append(parts, service.Component{Name: "credentials-vault", Run: func(ctx context.Context) error {
			if err := p.vault.Start(ctx); err != nil {
				return err
			}
			<-ctx.Done()
			return p.vault.Close()
		}})
	}
	if p.Deliverer != nil {
		parts = append(parts, service.Component{Name: "webhooks", Run: p.Deliverer.Run})
	}
	parts = append(parts,
		service.Component{Name: "republisher", Run: func(ctx context.Context) error {
			return p.Publisher.Run(ctx, publishing.RepublisherConfig{After: p.cfg.Stream.Republish})
		}},
		service.Component{Name: "results", Run: p.Results.Run},
	)
	if p.Observer != nil {
		parts = append(parts, service.Component{Name: "observer", Run: p.Observer.Run})
	}
	if p.Launcher != nil {
		parts = append(parts, service.Component{Name: "schedule-launcher", Run: p.Launcher.Run})
	}
	parts = append(parts, service.Component{Name: "workflow-engine", Run: p.WorkflowEngine.Run})
	parts = append(parts, p.consoleComponents()...)
	parts = append(parts, service.Component{Name: "api", Run: p.API.Run, Drain: p.API.Shutdown})
	return parts
}

// retention applies the retention settings hourly: run logs older than
// RUNLOG_RETENTION, deployments finished more than DEPLOYMENT_RETENTION
// ago, Idempotency-Keys older than IDEMPOTENCY_KEY_TTL.
func (p *Parts) retention(ctx context.Context) error {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		p.applyRetention(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *Parts) applyRetention(ctx context.Context) {
	if keep := p.cfg.RunLog.Retention; keep > 0 {
		n, err := p.Logs.DeleteBefore(ctx, time.Now().Add(-keep))
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn().Err(err).Msg("run log retention")
		case n > 0:
			p.log.Info().Int("deleted", n).Dur("retention", keep).Msg("old run logs deleted")
		}
	}
	n, err := p.Deployments.Prune(ctx, p.cfg.Keep.Deployments)
	switch {
	case err != nil && ctx.Err() == nil:
		p.log.Warn().Err(err).Msg("deployment retention")
	case n != (deployments.Pruned{}):
		p.log.Info().Int64("deployments", n.Deployments).Int64("publish_groups", n.Groups).
			Int64("idempotency_keys", n.IdempotencyKeys).Dur("retention", p.cfg.Keep.Deployments).
			Msg("old deployments deleted")
	}
}
