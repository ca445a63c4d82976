// Package health probes every READY server cheaply and often: a TCP
// connection to its SSH port and, when its rules give one, an HTTP GET of
// a health URL. N consecutive failures flag the server for recovery
// (fleet.FlagRecovery); a cool-down after each recovery keeps a flapping
// server from looping. Probes are spread evenly over the interval (each
// server at its own offset) and bounded in concurrency, so 10,000 servers
// never open 10,000 sockets at once.
package health

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

// Actor is the name the checker writes into history.
const Actor = "health"

// Config configures a Checker. Zero values take the defaults.
type Config struct {
	// Interval is how often each server is probed (default 1m).
	Interval time.Duration
	// Concurrency bounds the probes in flight (default 64).
	Concurrency int
	// Timeout bounds one probe (default 5s).
	Timeout time.Duration
	// Failures is how many consecutive failed probes flag a recovery
	// (default 3).
	Failures int
	// Cooldown is the least time between two recoveries of a server
	// (default 30m).
	Cooldown time.Duration
	// Active, when set, says whether this replica probes (the leader).
	Active func() bool
	// Flagged, when set, is called after a server was flagged (kicks the loop).
	Flagged func()
	Logger  zerolog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Checker probes READY servers.
type Checker struct {
	fleet *fleet.Store
	rules func() *rules.Set
	cfg   Config
	log   zerolog.Logger
	http  *http.Client

	mu       sync.Mutex
	failures map[string]int

	probes   *prometheus.CounterVec
	flagged  prometheus.Counter
	inFlight prometheus.Gauge
}

// New returns a Checker.
func New(f *fleet.Store, rulesFn func() *rules.Set, cfg Config) *Checker {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Failures <= 0 {
		cfg.Failures = 3
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = 30 * time.Minute
	}
	if rulesFn == nil {
		rulesFn = func() *rules.Set { return nil }
	}
	c := &Checker{fleet: f, rules: rulesFn, cfg: cfg, log: cfg.Logger.With().Str("component", "health").Logger(),
		failures: map[string]int{},
		http: &http.Client{Timeout: cfg.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect is an answer, not a hop to follow
		}},
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_health_probes_total", Help: "Health probes of READY servers, by kind (tcp, http) and result (ok, fail).",
		}, []string{"kind", "result"}),
		flagged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "autoprov_scheduler_health_recoveries_flagged_total", Help: "Servers flagged for recovery by failed probes.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_health_probes_in_flight", Help: "Health probes running now.",
		}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(c.probes, c.flagged, c.inFlight)
	}
	return c
}

// Run probes round after round until ctx is done.
func (c *Checker) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		start := time.Now()
		if c.cfg.Active == nil || c.cfg.Active() {
			if err := c.Round(ctx, c.cfg.Interval); err != nil && ctx.Err() == nil {
				c.log.Error().Err(err).Msg("health round failed")
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(max(0, c.cfg.Interval-time.Since(start))):
		}
	}
	return nil
}

type target struct {
	handle, addr, url string
	offset            time.Duration
}

// Round probes every READY, unpaused server once, spread over spread, and
// returns when all probes are done.
func (c *Checker) Round(ctx context.Context, spread time.Duration) error {
	targets, err := c.targets(ctx, spread)
	if err != nil {
		return err
	}
	start := time.Now()
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, t := range targets {
		if wait := time.Until(start.Add(t.offset)); wait > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			case <-time.After(wait):
			}
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.inFlight.Inc()
			err := c.probe(ctx, t)
			c.inFlight.Dec()
			if ctx.Err() == nil {
				c.record(ctx, t, err)
			}
		}()
	}
	wg.Wait()
	return nil
}

// targets lists the READY, unpaused servers with their probe offsets.
func (c *Checker) targets(ctx context.Context, spread time.Duration) ([]target, error) {
	set := c.rules()
	no := false
	var out []target
	after := ""
	seen := map[string]bool{}
	for {
		page, err := c.fleet.List(ctx, fleet.Filter{Statuses: []string{fleet.StatusReady}, Paused: &no}, after, fleet.MaxPageSize)
		if err != nil {
			return nil, err
		}
		for _, s := range page.Servers {
			seen[s.Handle] = true
			t := target{handle: s.Handle, addr: net.JoinHostPort(s.Address, strconv.Itoa(s.SSHPort)), offset: offset(s.Handle, spread)}
			if u := set.Plan(s.Labels).Settings.HealthURL; u != "" {
				t.url = strings.NewReplacer("{address}", hostForURL(s.Address), "{handle}", s.Handle).Replace(u)
			}
			out = append(out, t)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	c.mu.Lock()
	for h := range c.failures { // forget servers that left READY
		if !seen[h] {
			delete(c.failures, h)
		}
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].offset < out[j].offset })
	return out, nil
}

func hostForURL(addr string) string {
	if strings.Contains(addr, ":") {
		return "[" + addr + "]"
	}
	return addr
}

// offset places a server at a stable point of the interval.
func offset(handle string, spread time.Duration) time.Duration {
	if spread <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(handle))
	return time.Duration(h.Sum64() % uint64(spread))
}

// probe returns nil when the server answers.
func (c *Checker) probe(ctx context.Context, t target) error {
	d := net.Dialer{Timeout: c.cfg.Timeout}
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		c.probes.WithLabelValues("tcp", "fail").Inc()
		return fmt.Errorf("ssh port %s: %w", t.addr, err)
	}
	_ = conn.Close()
	c.probes.WithLabelValues("tcp", "ok").Inc()
	if t.url == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return fmt.Errorf("health url: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.probes.WithLabelValues("http", "fail").Inc()
		return fmt.Errorf("health url %s: %w", t.url, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		c.probes.WithLabelValues("http", "fail").Inc()
		return fmt.Errorf("health url %s: status %d", t.url, resp.StatusCode)
	}
	c.probes.WithLabelValues("http", "ok").Inc()
	return nil
}

// record counts consecutive failures and flags a recovery at the limit.
func (c *Checker) record(ctx context.Context, t target, err error) {
	c.mu.Lock()
	if err == nil {
		delete(c.failures, t.handle)
		c.mu.Unlock()
		return
	}
	c.failures[t.handle]++
	n := c.failures[t.handle]
	c.mu.Unlock()
	log := c.log.With().Str("server", t.handle).Logger()
	if n < c.cfg.Failures {
		log.Debug().Err(err).Int("failures", n).Msg("probe failed")
		return
	}
	flagged, ferr := c.fleet.FlagRecovery(ctx, t.handle, Actor,
		fmt.Sprintf("%d consecutive failed probes: %v", n, err), c.cfg.Cooldown)
	if ferr != nil {
		log.Error().Err(ferr).Msg("flag recovery failed")
		return
	}
	if !flagged {
		log.Debug().Int("failures", n).Msg("probe failed; recovery not flagged (cool-down, request or job in flight)")
		return
	}
	c.mu.Lock()
	delete(c.failures, t.handle)
	c.mu.Unlock()
	c.flagged.Inc()
	log.Warn().Err(err).Int("failures", n).Msg("server flagged for recovery")
	if c.cfg.Flagged != nil {
		c.cfg.Flagged()
	}
}
