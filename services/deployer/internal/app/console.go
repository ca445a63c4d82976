package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/console"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

// ConsoleConfig configures the web console served under /ui/ on the API's
// port (see docs/console.md).
type ConsoleConfig struct {
	Enabled    bool          `env:"CONSOLE_ENABLED" envDefault:"true" desc:"serve the web console under /ui/ on the API's port"`
	SessionTTL time.Duration `env:"CONSOLE_SESSION_TTL" envDefault:"12h" desc:"how long a console session lasts (it ends sooner at sign-out or when its key is revoked)"`
	Secure     bool          `env:"CONSOLE_SECURE_COOKIES" desc:"mark the console's cookies Secure although the API speaks plain HTTP (behind a TLS proxy); always on with API_TLS_CERT_FILE"`
	// RedisURLFile names a file holding an operator's Redis URL.
	RedisURLFile string `env:"CONSOLE_REDIS_URL_FILE" desc:"file holding the Redis URL of an operator's user (reads every stream, replays and drops dead letters) for the console's queues; unset: the deployer's own connection, which sees only its own streams"`
	// Readiness lists other services' /readyz as name=URL.
	Readiness []string `env:"CONSOLE_READINESS" envSeparator:"," desc:"name=URL of other services' /readyz shown on the console's overview, comma-separated, e.g. scheduler=http://127.0.0.1:9101/readyz"`
}

// Services parses Readiness, this deployer first.
func (c ConsoleConfig) Services() ([]console.Service, error) {
	out := []console.Service{{Name: "deployer"}}
	for _, item := range c.Readiness {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
			return nil, service.Invalid("CONSOLE_READINESS", "each item must be name=http(s)://host:port/readyz")
		}
		out = append(out, console.Service{Name: name, URL: u})
	}
	return out, nil
}

// validate checks the console's settings.
func (c ConsoleConfig) validate() []error {
	var errs []error
	if c.SessionTTL <= 0 {
		errs = append(errs, service.Invalid("CONSOLE_SESSION_TTL", "must be positive"))
	}
	if _, err := c.Services(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// buildConsole builds the web console and mounts it on the API's router
// (after api.New).
func (p *Parts) buildConsole(ctx context.Context, d service.Deps, streams deployments.Streams, authn *auth.Authenticator,
	keys *auth.Store, tls bool) error {
	cfg := p.cfg.Console
	services, err := cfg.Services()
	if err != nil {
		return err
	}
	rdb := d.Redis
	if cfg.RedisURLFile != "" {
		b, err := os.ReadFile(cfg.RedisURLFile)
		if err != nil {
			return service.Invalid("CONSOLE_REDIS_URL_FILE", "cannot read the file: %v", errors.Unwrap(err))
		}
		c, err := service.NewRedis(ctx, service.RedisConfig{URL: strings.TrimSpace(string(b))})
		if err != nil {
			return fmt.Errorf("console redis (CONSOLE_REDIS_URL_FILE): %w", err)
		}
		p.closers = append(p.closers, c.Close)
		rdb = c
	}
	var names []string
	for _, s := range []string{messages.StreamProvisionerQueue, streams.Queue, streams.JobQueue,
		messages.StreamProvisionerResults, streams.Results, streams.JobResults} {
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	c, err := console.New(console.Config{
		SessionTTL: cfg.SessionTTL, Secure: cfg.Secure || tls, AuthFailureRate: p.cfg.API.AuthFailureRate,
		Streams: names, Discover: []string{streams.JobQueue + ":*"}, Services: services, Events: events.StreamConfig{Heartbeat: p.cfg.API.SSEHeartbeat, Retry: p.cfg.API.SSERetry},
	}, console.Deps{
		API: p.API.Handler(), Auth: authn, Keys: keys, Forget: authn.Forget,
		Limiter:  auth.NewLimiter(d.Redis, auth.RateKeyPrefix, p.cfg.API.RateLimit, p.cfg.API.RateBurst),
		Sessions: console.NewSessions(d.DB), Deployments: p.Deployments, Fleet: fleet.New(d.DB, fleet.Options{}),
		ServerAt: func(ctx context.Context, address string) (string, error) {
			srv, err := store.FindServerByAddress(ctx, d.DB, address)
			if err != nil {
				return "", err
			}
			return srv.Handle, nil
		},
		Queues: stream.NewInspector(rdb), Events: p.Hub, Logs: p.Logs, Shutdown: p.API.Stopping(),
		Ping: func(ctx context.Context) error {
			if err := d.DB.Ping(ctx); err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			if err := d.Redis.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("redis: %w", err)
			}
			return nil
		},
		Logger: p.log,
	})
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	p.API.Mount(console.Prefix, c.Handler())
	return nil
}

// consoleComponents closes what the console opened (its operator Redis
// connection) once it stops: started before the API, so stopped after it.
func (p *Parts) consoleComponents() []service.Component {
	if len(p.closers) == 0 {
		return nil
	}
	return []service.Component{{Name: "console", Run: func(ctx context.Context) error {
		<-ctx.Done()
		var errs []error
		for _, c := range p.closers {
			errs = append(errs, c())
		}
		return errors.Join(errs...)
	}}}
}
