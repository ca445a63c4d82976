package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// Config configures the API. Zero values take the defaults.
type Config struct {
	// Addr is where the API listens.
	Addr string
	// TLS, when set, makes the API serve HTTPS with it (HTTP/2 offered);
	// nil: plain HTTP.
	TLS *tls.Config
	// MaxBody bounds request bodies. Default 64 KiB.
	MaxBody int64
	// MaxWait bounds ?wait=. Default 10m.
	MaxWait time.Duration
	// AuthFailureRate is how many failed authentications per second one
	// client address may make. Default 10.
	AuthFailureRate int
	// Rates are the default rate limit of keys (API_RATE_LIMIT,
	// API_RATE_BURST), shown for keys without a rate of their own.
	Rates auth.RateDefaults
	// Events configures the SSE streams.
	Events events.StreamConfig
	// ShutdownGrace bounds how long requests in flight may take to finish
	// at shutdown. Default 10s.
	ShutdownGrace time.Duration
}

// Keys is what the API needs of the key store.
type Keys interface {
	Create(ctx context.Context, nk auth.NewKey) (*auth.Key, string, error)
	List(ctx context.Context) ([]*auth.Key, error)
	Get(ctx context.Context, id string) (*auth.Key, error)
	Revoke(ctx context.Context, idOrName string) (*auth.Key, error)
}

// Deps are the API's collaborators.
type Deps struct {
	Deployments *deployments.Service
	// Credentials serves /api/v1/credentials; nil answers 503.
	Credentials *credentials.Service
	// Templates serves /api/v1/templates; nil answers 503.
	Templates *templates.Service
	// Triggers serves /api/v1/triggers and /api/v1/hooks; nil answers 503.
	Triggers *templates.Triggers
	// Notifications serves /api/v1/notifications; nil answers 503.
	Notifications *templates.Notifications
	// Workflows serves /api/v1/workflows and /api/v1/workflow-runs; nil
	// answers 503.
	Workflows *workflows.Service
	Keys      Keys
	Auth      Authenticator
	// Forget drops a revoked key from the authenticator's cache.
	Forget  func(keyID string)
	Limiter RateLimiter
	Hub     *events.Hub
	Logs    runlog.Store
	// Webhooks lists a deployment's webhook deliveries.
	Webhooks func(ctx context.Context, deploymentID string) ([]webhooks.Delivery, error)
	// WebhookSecret derives a key's webhook secret; nil when webhooks are
	// disabled.
	WebhookSecret func(keyID string) string
	// Fleet serves the servers endpoints; nil answers them 503.
	Fleet Fleet
	// Queues reads the job queues' consumers: a queued job whose pool no
	// replica serves says so, and autoprov_deployer_job_pool_replicas
	// counts them for the default pool and JobPools; nil: neither.
	Queues     QueueReader
	JobPools   []string
	Logger     zerolog.Logger
	Registerer prometheus.Registerer
}

// API is the HTTP API.
type API struct {
	cfg  Config
	deps Deps
	log  zerolog.Logger

	router   chi.Router
	shutdown chan struct{} // closed when the server shuts down
	once     sync.Once
	addr     string
	ready    chan struct{}
}

// New builds the API and its router.
func New(cfg Config, deps Deps) (*API, error) {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 64 << 10
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Minute
	}
	if cfg.AuthFailureRate <= 0 {
		cfg.AuthFailureRate = 10
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	if deps.Auth != nil {
		deps.Auth = contextKeys{deps.Auth} // keys the console checked (WithKey)
	}
	a := &API{cfg: cfg, deps: deps, log: deps.Logger.With().Str("component", "api").Logger(),
		shutdown: make(chan struct{}), ready: make(chan struct{})}
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "autoprov_deployer_http_request_duration_seconds",
		Help:    "Duration of API requests by method, route and status (SSE streams included).",
		Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60},
	}, []string{"method", "route", "code"})
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(duration); err != nil {
			return nil, fmt.Errorf("api metrics: %w", err)
		}
		if deps.Queues != nil && deps.Deployments != nil {
			if err := deps.Registerer.Register(&poolReplicas{
				desc: poolReplicasDesc(),
				q:    deps.Queues, queue: deps.Deployments.JobQueue, pools: append([]string{""}, deps.JobPools...),
			}); err != nil {
				return nil, fmt.Errorf("api metrics: %w", err)
			}
		}
	}
	a.router = a.routes(duration)
	return a, nil
}

// Handler returns the API's handler.
func (a *API) Handler() http.Handler { return a.router }

// Mount serves h under pattern (the web console under /ui) on the API's
// router, behind its request ids, logs and panic recovery. Call it before
// Run.
func (a *API) Mount(pattern string, h http.Handler) { a.router.Mount(pattern, h) }

// Router returns the chi router, for the route/document check.
func (a *API) Router() chi.Routes { return a.router }

// Listening is a readiness check: nil once Run listens on the API's
// address, an error before.
func (a *API) Listening(context.Context) error {
	select {
	case <-a.ready:
		return nil
	default:
		return errors.New("the API does not listen yet")
	}
}

// Addr returns the address the API listens on, once Run listens.
func (a *API) Addr() string {
	<-a.ready
	return a.addr
}

// Shutdown ends the streams and waits now: SSE streams end with a retry
// hint, ?wait= requests answer with the current state.
func (a *API) Shutdown() { a.once.Do(func() { close(a.shutdown) }) }

// Stopping is closed once Shutdown was called: streams served beside the
// API (the console's) end with the API's own.
func (a *API) Stopping() <-chan struct{} { return a.shutdown }

// Run serves until ctx is done, then shuts down gracefully: no new
// connections, streams and waits end at once, other requests finish within
// ShutdownGrace.
func (a *API) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	a.addr = ln.Addr().String()
	close(a.ready)
	srv := &http.Server{
		Handler:           a.router,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// No WriteTimeout: SSE and ?wait= responses are long; handlers set
		// their own write deadlines.
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 32 << 10,
		ErrorLog:       log.New(a.log, "", 0),
	}
	srv.RegisterOnShutdown(a.Shutdown)
	a.log.Info().Str("addr", a.addr).Bool("tls", a.cfg.TLS != nil).Msg("API listening")
	errc := make(chan error, 1)
	go func() {
		if a.cfg.TLS != nil {
			srv.TLSConfig = a.cfg.TLS.Clone()
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("api: %w", err)
	case <-ctx.Done():
	}
	a.Shutdown()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownGrace)
	defer cancel()
	err = srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close()
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("api: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("api shutdown: %w", err)
	}
	return nil
}
