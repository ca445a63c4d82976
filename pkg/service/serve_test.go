package service_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// serveConfig is a service configuration as a service declares it.
type serveConfig struct {
	service.Common
	Workers int `env:"WORKERS" envDefault:"2" desc:"workers"`
}

// newServeConfig returns a loaded configuration on the test's own Redis and
// an empty database, with the admin server on a free port.
func newServeConfig(t *testing.T) *serveConfig {
	t.Helper()
	environ := map[string]string{
		"REDIS_URL":    testenv.RedisURL(t),
		"DATABASE_URL": testenv.EmptyDatabase(t),
		"ADMIN_ADDR":   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
	}
	cfg := &serveConfig{}
	if err := service.Load(func(k string) string { return environ[k] }, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// events records what happened, in order.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, fmt.Sprintf(format, args...))
}

func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

// status returns the status code of GET url, or 0 when nothing answers.
func status(url string) int {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestServeOrder pins the run sequence every service shares: the admin
// server answers /healthz while the components are set up (with the
// database migrated and Redis open, /readyz still 503), /readyz turns ready
// once they run; at shutdown /readyz turns 503 before any component stops,
// the components stop in reverse order while /healthz, Postgres and Redis
// still work, and only then are the admin server, Redis and Postgres closed.
func TestServeOrder(t *testing.T) {
	cfg := newServeConfig(t)
	admin := "http://" + cfg.AdminAddr
	ev := &events{}
	running := make(chan struct{}, 2)
	var deps service.Deps

	component := func(name string) service.Component {
		return service.Component{Name: name, Run: func(ctx context.Context) error {
			ev.add("start %s", name)
			running <- struct{}{}
			<-ctx.Done()
			ev.add("stop %s: readyz %d, healthz %d", name, status(admin+"/readyz"), status(admin+"/healthz"))
			// What Serve opened is still open while components stop.
			if err := deps.DB.Ping(context.Background()); err != nil {
				ev.add("stop %s: postgres: %v", name, err)
			}
			if err := deps.Redis.Ping(context.Background()).Err(); err != nil {
				ev.add("stop %s: redis: %v", name, err)
			}
			return nil
		}}
	}
	setup := func(ctx context.Context, d service.Deps) ([]service.Component, error) {
		deps = d
		version, err := store.SchemaVersion(ctx, d.DB)
		if err != nil || version < 1 {
			return nil, fmt.Errorf("schema version %d, %v: migrations not applied before the components", version, err)
		}
		if err := d.Redis.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis not open before the components: %w", err)
		}
		if d.Getenv("SERVE_TEST") != "passed on" || d.Metrics == nil || d.Admin == nil {
			return nil, errors.New("deps incomplete")
		}
		ev.add("setup: readyz %d, healthz %d", status(admin+"/readyz"), status(admin+"/healthz"))
		return []service.Component{component("worker"), component("consumer")}, nil
	}

	var logs testenv.SafeBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	getenv := func(k string) string { return map[string]string{"SERVE_TEST": "passed on"}[k] }
	go func() { done <- service.Serve(ctx, zerolog.New(&logs), cfg, getenv, setup) }()

	for range 2 {
		select {
		case <-running:
		case err := <-done:
			t.Fatalf("Serve returned before the components ran: %v\n%s", err, logs.String())
		}
	}
	if code := status(admin + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d with every component running, want 200", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v after a requested shutdown, want nil", err)
	}

	want := []string{
		"setup: readyz 503, healthz 200",
		"start consumer", "start worker", // in any order: sorted below
		"stop consumer: readyz 503, healthz 200",
		"stop worker: readyz 503, healthz 200",
	}
	got := ev.get()
	if len(got) >= 3 {
		slices.Sort(got[1:3])
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("run sequence (-want, +got):\n%s", diff)
	}
	if code := status(admin + "/healthz"); code != 0 {
		t.Errorf("/healthz answers %d after Serve returned: admin server not stopped", code)
	}
	if err := deps.DB.Ping(context.Background()); err == nil {
		t.Error("the Postgres pool is still open after Serve returned")
	}
	if err := deps.Redis.Ping(context.Background()).Err(); err == nil {
		t.Error("the Redis client is still open after Serve returned")
	}
	for _, msg := range []string{`"message":"migration applied"`, `"message":"started"`, `"message":"stopped"`} {
		if !strings.Contains(logs.String(), msg) {
			t.Errorf("log lacks %s:\n%s", msg, logs.String())
		}
	}
}

// TestServeShutdownWhileStarting: a shutdown requested while the components
// are set up is a clean stop (nil, logged as such), and everything opened
// so far is closed.
func TestServeShutdownWhileStarting(t *testing.T) {
	cfg := newServeConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testenv.SafeBuffer
	err := service.Serve(ctx, zerolog.New(&logs), cfg, nil, func(ctx context.Context, d service.Deps) ([]service.Component, error) {
		if v := d.Getenv("PATH"); v != "" { // no getenv: an empty environment
			return nil, fmt.Errorf("Getenv(PATH) = %q without an environment", v)
		}
		cancel() // SIGTERM arrives while, say, a secrets backend is being opened
		<-ctx.Done()
		return nil, fmt.Errorf("open secrets: %w", ctx.Err())
	})
	if err != nil {
		t.Fatalf("Serve = %v, want nil for a shutdown requested while starting", err)
	}
	if !strings.Contains(logs.String(), `"message":"shutdown requested while starting"`) {
		t.Errorf("not logged as a shutdown while starting:\n%s", logs.String())
	}
	if code := status("http://" + cfg.AdminAddr + "/healthz"); code != 0 {
		t.Errorf("/healthz answers %d after Serve returned", code)
	}
}

// TestServeFailures: a failure before the components run is returned with
// its context, and the admin server is stopped (its port is free again).
func TestServeFailures(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		cfg       func(*serveConfig)
		setup     service.ComponentsFunc
		wantErr   error  // errors.Is, when set
		wantInErr string // substring of the error
	}{
		{
			name: "components setup fails",
			setup: func(context.Context, service.Deps) ([]service.Component, error) {
				return nil, boom
			},
			wantErr:   boom,
			wantInErr: "set up components: boom",
		},
		{
			name: "a component fails",
			setup: func(context.Context, service.Deps) ([]service.Component, error) {
				return []service.Component{{Name: "worker", Run: func(context.Context) error { return boom }}}, nil
			},
			wantErr:   boom,
			wantInErr: "worker: boom",
		},
		{
			name: "Postgres does not answer",
			cfg: func(c *serveConfig) {
				c.DatabaseURL = fmt.Sprintf("postgres://u:secret-pw@127.0.0.1:%d/db?sslmode=disable&connect_timeout=5", testenv.ClosedPort(t))
			},
			wantInErr: "127.0.0.1",
		},
		{
			name:      "Redis does not answer",
			cfg:       func(c *serveConfig) { c.Redis.URL = fmt.Sprintf("redis://127.0.0.1:%d/0", testenv.ClosedPort(t)) },
			wantInErr: "ping redis",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newServeConfig(t)
			if tc.cfg != nil {
				tc.cfg(cfg)
			}
			setup := tc.setup
			if setup == nil {
				setup = func(context.Context, service.Deps) ([]service.Component, error) {
					return nil, errors.New("components set up although starting failed")
				}
			}
			var logs bytes.Buffer
			err := service.Serve(context.Background(), zerolog.New(&logs), cfg, nil, setup)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("Serve = %v, want an error with %q", err, tc.wantInErr)
			}
			if strings.Contains(err.Error(), "secret-pw") || strings.Contains(logs.String(), "secret-pw") {
				t.Errorf("the database password leaked: %v\n%s", err, logs.String())
			}
			if code := status("http://" + cfg.AdminAddr + "/healthz"); code != 0 {
				t.Errorf("/healthz answers %d after Serve failed: admin server not stopped", code)
			}
		})
	}
}

// TestRun covers the command line and configuration steps of Run before
// it serves.
func TestRun(t *testing.T) {
	p := service.Program[*serveConfig]{
		Name:      "demo",
		Summary:   "serves demos",
		NewConfig: func() *serveConfig { return &serveConfig{Common: service.Common{AdminAddr: "127.0.0.1:9199"}} },
		Components: func(context.Context, *serveConfig, service.Deps) ([]service.Component, error) {
			return nil, errors.New("not reached")
		},
	}
	none := func(string) string { return "" }

	var stdout, stderr bytes.Buffer
	err := service.Run(context.Background(), p, []string{"--help"}, none, &stdout, &stderr)
	if !errors.Is(err, service.ErrHelp) || service.ExitCode(err) != 0 {
		t.Errorf("--help: %v (exit %d), want ErrHelp (exit 0)", err, service.ExitCode(err))
	}
	if !strings.Contains(stdout.String(), "demo: serves demos") || !testenv.UsageHasRow(stdout.String(), "ADMIN_ADDR", "127.0.0.1:9199") || !testenv.UsageHasRow(stdout.String(), "WORKERS", "2") {
		t.Errorf("--help output:\n%s", stdout.String())
	}

	err = service.Run(context.Background(), p, []string{"extra"}, none, &stdout, &stderr)
	if service.ExitCode(err) != 2 || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("an argument: %v (exit %d), want a usage error (exit 2)", err, service.ExitCode(err))
	}

	bad := map[string]string{"WORKERS": "many", "LOG_LEVEL": "loud"}
	err = service.Run(context.Background(), p, nil, func(k string) string { return bad[k] }, &stdout, &stderr)
	var cfgErr *service.ConfigError
	if !errors.As(err, &cfgErr) || len(cfgErr.Problems) != 2 || service.ExitCode(err) != 2 {
		t.Errorf("bad configuration: %v (exit %d), want a ConfigError with 2 problems (exit 2)", err, service.ExitCode(err))
	}
	if stderr.Len() != 0 {
		t.Errorf("Run logged before the configuration was valid:\n%s", stderr.String())
	}

	// A valid configuration is served: the components' error comes back,
	// and the log carries the service's name.
	cfg := newServeConfig(t)
	good := map[string]string{"REDIS_URL": cfg.Redis.URL, "DATABASE_URL": cfg.DatabaseURL, "ADMIN_ADDR": cfg.AdminAddr, "LOG_FORMAT": "json"}
	err = service.Run(context.Background(), p, nil, func(k string) string { return good[k] }, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "set up components: not reached") || service.ExitCode(err) != 1 {
		t.Errorf("Run = %v (exit %d), want the components' error (exit 1)", err, service.ExitCode(err))
	}
	if !strings.Contains(stderr.String(), `"service":"demo"`) {
		t.Errorf("log lacks the service name:\n%s", stderr.String())
	}
}

// TestRunCheckConfig: --check-config validates the configuration and exits
// without connecting to anything or starting a component: every problem
// comes back (exit 2), a valid one is reported on stdout (exit 0).
func TestRunCheckConfig(t *testing.T) {
	started := false
	p := service.Program[*serveConfig]{
		Name:      "demo",
		Summary:   "serves demos",
		NewConfig: func() *serveConfig { return &serveConfig{Common: service.Common{AdminAddr: "127.0.0.1:9199"}} },
		Components: func(context.Context, *serveConfig, service.Deps) ([]service.Component, error) {
			started = true
			return nil, errors.New("not reached")
		},
	}
	tests := []struct {
		name     string
		environ  map[string]string
		wantCode int
		wantOut  string
		problems []string
	}{
		// Nothing listens on these addresses: the check must not dial.
		{"valid", map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "DATABASE_URL": "postgres://u:secretpw@127.0.0.1:1/db"}, 0, "demo: configuration valid\n", nil},
		{"invalid", map[string]string{"WORKERS": "many", "LOG_LEVEL": "loud", "DATABASE_URL": "mysql://u:secretpw@h/db"}, 2, "", []string{"WORKERS", "LOG_LEVEL", "DATABASE_URL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := service.Run(context.Background(), p, []string{"--check-config"}, func(k string) string { return tt.environ[k] }, &stdout, &stderr)
			if got := service.ExitCode(err); got != tt.wantCode {
				t.Fatalf("exit %d (%v), want %d", got, err, tt.wantCode)
			}
			if stdout.String() != tt.wantOut {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.wantOut)
			}
			var cfgErr *service.ConfigError
			if len(tt.problems) > 0 && (!errors.As(err, &cfgErr) || len(cfgErr.Problems) != len(tt.problems)) {
				t.Fatalf("error %v, want a ConfigError with %d problems", err, len(tt.problems))
			}
			for _, v := range tt.problems {
				if !strings.Contains(err.Error(), v+":") {
					t.Errorf("error does not name %s:\n%v", v, err)
				}
			}
			if err != nil && strings.Contains(err.Error(), "secretpw") {
				t.Errorf("error echoes the database password:\n%v", err)
			}
			if started || stderr.Len() != 0 {
				t.Errorf("--check-config started the service (components %v, log %q)", started, stderr.String())
			}
		})
	}
}
