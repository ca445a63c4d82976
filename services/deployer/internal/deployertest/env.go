// Package deployertest runs the deployer's components in a test against
// real Postgres and Redis, with the stand-in infra (fakeinfra), in a
// database of each of the test's own and on stream names of its own, and
// gives the test an HTTP client.
package deployertest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/app"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

// SigningKey is the webhook signing key of test deployers.
const SigningKey = "test-webhook-signing-key-0123456789abcdef"

// The projects of the CI key: Project is Request's, OtherProject a second
// one.
const (
	Project      = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	OtherProject = "11111111-2222-3333-4444-555555555555"
)

// Options tune Start.
type Options struct {
	// Env sets configuration variables (as the binary reads them).
	Env map[string]string
	// NoInfra leaves the stand-in infra stopped (StartInfra starts it).
	NoInfra bool
	// PlanFor chooses what each job does in the stand-in infra.
	PlanFor func(m *messages.AnsibleDeployMessage) fakeinfra.Plan
	// JobPlanFor chooses what each Ansible job does in it.
	JobPlanFor func(m *messages.AnsibleJobMessage) fakeinfra.Plan
	// Resolver resolves webhook host names.
	Resolver *net.Resolver
	// DB and Redis reuse another Env's (a restart of the deployer).
	DB      *pgxpool.Pool
	Redis   *redis.Client
	Streams deployments.Streams
}

// Env is a running deployer.
type Env struct {
	T       testing.TB
	DB      *pgxpool.Pool
	Redis   *redis.Client
	Streams deployments.Streams
	Parts   *app.Parts
	Infra   *fakeinfra.Infra
	URL     string
	Logs    *testenv.SafeBuffer
	Client  *http.Client
	// Admin and CI are keys with the admin scope and with
	// deployments:read+write for Project and OtherProject.
	Admin, CI string
	AdminID   string
	CIID      string

	stop      context.CancelFunc
	done      chan error
	infraStop context.CancelFunc
	infraDone chan struct{}
	opts      Options
	stopOnce  sync.Once
}

// Start runs a deployer for the test; it is stopped when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	e := &Env{T: t, DB: o.DB, Redis: o.Redis, Streams: o.Streams, Logs: &testenv.SafeBuffer{}, opts: o}
	if e.DB == nil {
		e.DB = testenv.Pool(t)
	}
	if e.Redis == nil {
		// A Redis database of the test's own: the deployer's keys of fixed
		// names (the rate limit buckets, among them the failed
		// authentications of 127.0.0.1) are the test's alone, so tests run
		// in parallel.
		opt, err := redis.ParseURL(testenv.RedisDB(t))
		if err != nil {
			t.Fatal(err)
		}
		e.Redis = redis.NewClient(opt)
		t.Cleanup(func() { _ = e.Redis.Close() })
	}
	if e.Streams == (deployments.Streams{}) {
		e.Streams = deployments.Streams{Queue: testenv.Unique("queue-"), Results: testenv.Unique("results-"),
			JobQueue: testenv.Unique("jobqueue-"), JobResults: testenv.Unique("jobresults-")}
		// Streams of its own are removed when the test ends (after the
		// deployer stops: cleanups run last first), so that tests and
		// benchmarks (a benchmark's queue holds tens of MB) do not pile up
		// in a shared Redis, whose forks for AOF rewrites grow with it.
		t.Cleanup(func() {
			e.Redis.Del(context.Background(), e.Streams.Queue, e.Streams.Results, e.Streams.JobQueue, e.Streams.JobResults)
		})
	}
	env := map[string]string{
		"API_ADDR": "127.0.0.1:0", "WEBHOOK_SIGNING_KEY": SigningKey, "LOG_FORMAT": "json",
		"WEBHOOK_BACKOFF_MIN": "100ms", "WEBHOOK_BACKOFF_MAX": "400ms", "API_RATE_LIMIT": "1000", "API_RATE_BURST": "2000",
		"API_KEY_CACHE_TTL": "0s", "STREAM_GROUP": testenv.Unique("deployer-"),
	}
	for k, v := range o.Env {
		env[k] = v
	}
	cfg := app.NewConfig()
	if err := service.Load(func(k string) string { return env[k] }, cfg); err != nil {
		t.Fatal(err)
	}
	level, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(e.Logs).Level(level).With().Timestamp().Logger()
	ctx, cancel := context.WithCancel(context.Background())
	parts, err := app.Build(ctx, cfg, service.Deps{Logger: log, DB: e.DB, Redis: e.Redis, Metrics: prometheus.NewRegistry()},
		app.Options{Streams: e.Streams, Resolver: o.Resolver})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e.Parts, e.stop, e.done = parts, cancel, make(chan error, 1)
	go func() { e.done <- service.RunComponents(ctx, log, 20*time.Second, parts.Components()...) }()
	e.URL = "http://" + parts.API.Addr()
	e.Client = &http.Client{Timeout: time.Minute}
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("deployer logs:\n%s", e.Logs.String())
		}
	})
	// Consumers create their groups at start: wait until results can be read.
	testenv.WaitFor(t, 30*time.Second, "the deployer's consumers", func() bool {
		n, _ := e.Redis.Exists(context.Background(), e.Streams.Results).Result()
		return n == 1
	})
	if o.DB == nil {
		keys := auth.NewStore(e.DB)
		k, s, err := keys.Create(context.Background(), auth.NewKey{Name: "admin", Scopes: []auth.Scope{auth.ScopeAdmin}})
		if err != nil {
			t.Fatal(err)
		}
		e.Admin, e.AdminID = s, k.ID
		k, s, err = keys.Create(context.Background(), auth.NewKey{Name: "ci", Scopes: []auth.Scope{auth.ScopeDeploymentsWrite},
			Projects: []string{Project, OtherProject}})
		if err != nil {
			t.Fatal(err)
		}
		e.CI, e.CIID = s, k.ID
	}
	e.Infra = &fakeinfra.Infra{DB: e.DB, Redis: e.Redis, Queue: e.Streams.Queue, Results: e.Streams.Results,
		Logs: parts.Logs, PlanFor: o.PlanFor, JobQueue: e.Streams.JobQueue, JobResults: e.Streams.JobResults,
		JobPlanFor: o.JobPlanFor}
	if !o.NoInfra {
		e.StartInfra()
	}
	return e
}

// Key creates a key named name with scopes, bound to projects (none: a
// fleet-wide key), and returns its secret.
func (e *Env) Key(name string, scopes []auth.Scope, projects ...string) string {
	e.T.Helper()
	_, s, err := auth.NewStore(e.DB).Create(context.Background(), auth.NewKey{Name: name, Scopes: scopes,
		Projects: projects, FleetWide: len(projects) == 0})
	if err != nil {
		e.T.Fatal(err)
	}
	return s
}

// StartInfra starts the stand-in infra.
func (e *Env) StartInfra() {
	ctx, cancel := context.WithCancel(context.Background())
	e.infraStop, e.infraDone = cancel, make(chan struct{})
	go func() {
		defer close(e.infraDone)
		if err := e.Infra.Run(ctx); err != nil {
			e.T.Errorf("fake infra: %v", err)
		}
	}()
}

// Stop stops the deployer (and the stand-in infra) gracefully.
func (e *Env) Stop() {
	e.stopOnce.Do(func() {
		if e.infraStop != nil {
			e.infraStop()
			<-e.infraDone
		}
		e.stop()
		if err := <-e.done; err != nil {
			e.T.Errorf("deployer stopped with: %v", err)
		}
	})
}

// Do sends a request with key (none when "") and a JSON body (a string is
// sent as it is), and returns the response with its body read.
func (e *Env) Do(method, path, key string, body any, hdr ...string) (*http.Response, []byte) {
	e.T.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.T.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.URL+path, r)
	if err != nil {
		e.T.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		e.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.T.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, data
}

// JSON decodes data into a new T, failing the test on error.
func JSON[T any](t testing.TB, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", truncate(data), err)
	}
	return v
}

func truncate(b []byte) string {
	if len(b) > 500 {
		return string(b[:500]) + "..."
	}
	return string(b)
}

// Request returns a valid deployment request body.
func Request() map[string]any {
	return map[string]any{
		"project_id":     Project,
		"repo_full_name": "acme/shop",
		"branch":         "main",
		"server_ip":      "198.51.100.7",
		"port":           8080,
	}
}

// QueueLen returns the entries of the request queue.
func (e *Env) QueueLen() int64 {
	n, err := e.Redis.XLen(context.Background(), e.Streams.Queue).Result()
	if err != nil {
		e.T.Fatal(err)
	}
	return n
}
