package service

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// NewRegistry returns a Prometheus registry of the service's own (never the
// global one) holding the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// Check is a readiness check: nil when the dependency it probes answers.
// It must return once ctx is done.
type Check func(ctx context.Context) error

// AdminConfig configures an Admin server. Zero values mean the defaults.
type AdminConfig struct {
	// Addr is the host:port to listen on ("127.0.0.1:0" picks a free port).
	Addr string
	// Logger receives the server's own errors.
	Logger zerolog.Logger
	// Registry is served on /metrics; nil means NewRegistry().
	Registry *prometheus.Registry
	// CheckTimeout bounds each readiness check; default 2s.
	CheckTimeout time.Duration
	// StopTimeout bounds the graceful stop Run does; default 5s.
	StopTimeout time.Duration
}

// Admin is the admin HTTP server of a service:
//
//	GET /healthz  200 while the process serves HTTP (liveness)
//	GET /readyz   200 with per-check JSON when the service is marked ready and
//	              every check passes, 503 otherwise (starting, draining, failing);
//	              advisory checks are shown (and listed in "degraded" when they
//	              fail) but never make it 503
//	GET /metrics  Prometheus metrics of the service's registry
//
// It follows a Start/Stop contract: Start listens and serves in the
// background, Stop shuts down gracefully and is idempotent; Run combines
// them for RunComponents.
type Admin struct {
	cfg    AdminConfig
	mux    *http.ServeMux
	logger zerolog.Logger

	mu       sync.Mutex
	checks   map[string]Check
	advisory map[string]bool // checks that do not decide readiness
	phase    string          // phaseStarting, phaseReady, phaseDraining
	srv      *http.Server
	addr     string
	done     chan struct{} // closed when Serve returned
	err      error         // why Serve returned, if not because of Stop

	stopOnce sync.Once
	stopErr  error
}

const (
	phaseStarting = "starting"
	phaseReady    = "ready"
	phaseDraining = "draining"
)

// NewAdmin returns an admin server for cfg, not yet listening.
func NewAdmin(cfg AdminConfig) (*Admin, error) {
	if cfg.Addr == "" {
		return nil, errors.New("admin server: no address")
	}
	if cfg.Registry == nil {
		cfg.Registry = NewRegistry()
	}
	cfg.CheckTimeout = cmp.Or(max(cfg.CheckTimeout, 0), 2*time.Second)
	cfg.StopTimeout = cmp.Or(max(cfg.StopTimeout, 0), 5*time.Second)
	a := &Admin{
		cfg:      cfg,
		mux:      http.NewServeMux(),
		logger:   cfg.Logger.With().Str("component", "admin").Logger(),
		checks:   map[string]Check{},
		advisory: map[string]bool{},
		phase:    phaseStarting,
	}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	a.mux.HandleFunc("GET /readyz", a.serveReady)
	a.mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(cfg.Registry,
		promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry})))
	return a, nil
}

// Registry returns the registry served on /metrics, for the service's own metrics.
func (a *Admin) Registry() *prometheus.Registry { return a.cfg.Registry }

// AddCheck registers (or replaces) the readiness check name. It may be
// called at any time, also while serving.
func (a *Admin) AddCheck(name string, check Check) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks[name] = check
	delete(a.advisory, name)
}

// AddAdvisoryCheck registers (or replaces) a check /readyz runs and shows
// without deciding readiness on it: a failing advisory check is marked
// "advisory" and named in the body's "degraded" list while the service
// stays ready (a notification channel that is down: the service still
// works, people should know).
func (a *Admin) AddAdvisoryCheck(name string, check Check) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks[name] = check
	a.advisory[name] = true
}

// Handle adds an endpoint to the admin server (net/http pattern syntax).
func (a *Admin) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// Handler returns the server's handler, for tests and embedding.
func (a *Admin) Handler() http.Handler { return a.mux }

// MarkReady ends the starting phase: from now on /readyz reports the checks.
func (a *Admin) MarkReady() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.phase == phaseStarting {
		a.phase = phaseReady
	}
}

// Drain makes /readyz answer 503 from now on, so that load balancers and
// orchestrators stop routing to the service while it shuts down; /healthz
// and /metrics keep working until Stop.
func (a *Admin) Drain() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.phase = phaseDraining
}

// Start listens on the configured address and serves in the background.
// Listen errors (address in use) are returned; a later failure of the server
// shows in Run. Start may be called once.
func (a *Admin) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		return errors.New("admin server: already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("admin server: %w", err)
	}
	a.srv = &http.Server{
		Handler:           a.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          log.New(a.logger, "", 0),
	}
	a.addr = ln.Addr().String()
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		if err := a.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			a.mu.Lock()
			a.err = fmt.Errorf("admin server: %w", err)
			a.mu.Unlock()
		}
	}()
	a.logger.Info().Str("addr", a.addr).Msg("admin server listening")
	if host, _, err := net.SplitHostPort(a.addr); err == nil && !IsLoopbackHost(host) {
		a.logger.Warn().Str("addr", a.addr).Msg("admin server listens beyond loopback: /metrics and /readyz are unauthenticated")
	}
	return nil
}

// Addr returns the address the server listens on once started ("" before).
func (a *Admin) Addr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addr
}

// Stop shuts the server down gracefully, waiting for requests in flight
// until ctx is done, then closes what is left. It is idempotent (later calls
// return the first result) and a no-op before Start.
func (a *Admin) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() {
		a.mu.Lock()
		srv, done := a.srv, a.done
		a.mu.Unlock()
		if srv == nil {
			return
		}
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
			a.stopErr = fmt.Errorf("stop admin server: %w", err)
		}
		<-done
	})
	return a.stopErr
}

// Run serves (starting the server if Start was not called) until ctx is
// done, then stops it within AdminConfig.StopTimeout. It returns early with
// an error if the server fails.
func (a *Admin) Run(ctx context.Context) error {
	a.mu.Lock()
	started := a.srv != nil
	a.mu.Unlock()
	if !started {
		if err := a.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-done:
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.err != nil {
			return a.err
		}
		return errors.New("admin server: stopped")
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.StopTimeout)
	defer cancel()
	return a.Stop(stopCtx)
}

// Component returns the server as a Component for RunComponents: Run serves,
// and Drain turns /readyz to 503 as soon as shutdown begins.
func (a *Admin) Component() Component {
	return Component{Name: "admin", Run: a.Run, Drain: a.Drain}
}

// CheckResult is the outcome of one readiness check in the /readyz body.
type CheckResult struct {
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
	Duration float64 `json:"duration_ms"`
	// Advisory: the check does not decide readiness (AddAdvisoryCheck).
	Advisory bool `json:"advisory,omitempty"`
}

// Readiness is the /readyz body.
type Readiness struct {
	// Status is "ready", "not_ready" (a check failed), "starting" or "draining".
	Status string                 `json:"status"`
	Checks map[string]CheckResult `json:"checks,omitempty"`
	// Degraded names the failing advisory checks.
	Degraded []string `json:"degraded,omitempty"`
}

func (a *Admin) serveReady(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	phase := a.phase
	checks := make(map[string]Check, len(a.checks))
	for name, c := range a.checks {
		checks[name] = c
	}
	advisory := maps.Clone(a.advisory)
	a.mu.Unlock()

	body := Readiness{Status: phase}
	if phase == phaseReady {
		body.Checks = a.runChecks(r.Context(), checks, advisory)
		for name, res := range body.Checks {
			switch {
			case res.OK:
			case res.Advisory:
				body.Degraded = append(body.Degraded, name)
			default:
				body.Status = "not_ready"
			}
		}
		sort.Strings(body.Degraded)
	}
	code := http.StatusOK
	if body.Status != phaseReady {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// runChecks runs the checks concurrently, each bounded by CheckTimeout.
func (a *Admin) runChecks(ctx context.Context, checks map[string]Check, advisory map[string]bool) map[string]CheckResult {
	names := make([]string, 0, len(checks))
	for name := range checks {
		names = append(names, name)
	}
	sort.Strings(names)
	results := make([]CheckResult, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			results[i] = a.runCheck(ctx, name, checks[name], advisory[name])
		})
	}
	wg.Wait()
	out := make(map[string]CheckResult, len(names))
	for i, name := range names {
		out[name] = results[i]
	}
	return out
}

func (a *Admin) runCheck(ctx context.Context, name string, check Check, advisory bool) (res CheckResult) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.CheckTimeout)
	defer cancel()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			res = CheckResult{Error: fmt.Sprintf("check panicked: %v", p)}
		}
		res.Duration = float64(time.Since(start).Microseconds()) / 1000
		res.Advisory = advisory
		switch {
		case res.OK:
		case advisory:
			a.logger.Debug().Str("check", name).Str("error", res.Error).Msg("advisory check failed")
		default:
			a.logger.Warn().Str("check", name).Str("error", res.Error).Msg("readiness check failed")
		}
	}()
	if err := check(ctx); err != nil {
		return CheckResult{Error: err.Error()}
	}
	return CheckResult{OK: true}
}
