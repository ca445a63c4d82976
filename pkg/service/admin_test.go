package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// startAdmin starts an admin server on a free port, stopped when the test ends.
func startAdmin(t *testing.T, cfg service.AdminConfig) (*service.Admin, string) {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	a, err := service.NewAdmin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return a, "http://" + a.Addr()
}

// client does not keep connections, so that no goroutine outlives a test.
func client() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := client().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func getReady(t *testing.T, base string) (int, service.Readiness) {
	t.Helper()
	code, body := get(t, base+"/readyz")
	var r service.Readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("readyz body %q: %v", body, err)
	}
	return code, r
}

func TestAdminReadiness(t *testing.T) {
	rdb := testenv.Redis(t)
	pool := testenv.Pool(t)
	// Long enough for a Postgres ping on a loaded machine; the slow check
	// waits it out twice.
	a, base := startAdmin(t, service.AdminConfig{CheckTimeout: 1500 * time.Millisecond})
	a.AddCheck("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	a.AddCheck("postgres", pool.Ping)

	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("healthz while starting: %d %q", code, body)
	}
	if code, r := getReady(t, base); code != http.StatusServiceUnavailable || r.Status != "starting" {
		t.Errorf("readyz before MarkReady: %d %+v", code, r)
	}

	a.MarkReady()
	code, r := getReady(t, base)
	if code != http.StatusOK || r.Status != "ready" || !r.Checks["redis"].OK || !r.Checks["postgres"].OK {
		t.Errorf("readyz with passing checks: %d %+v", code, r)
	}

	a.AddCheck("broken", func(context.Context) error { return errors.New("disk on fire") })
	a.AddCheck("slow", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	code, r = getReady(t, base)
	if code != http.StatusServiceUnavailable || r.Status != "not_ready" {
		t.Errorf("readyz with a failing check: %d %+v", code, r)
	}
	if c := r.Checks["broken"]; c.OK || c.Error != "disk on fire" {
		t.Errorf("broken check: %+v", c)
	}
	if c := r.Checks["slow"]; c.OK || !strings.Contains(c.Error, "deadline exceeded") {
		t.Errorf("slow check: %+v", c)
	}
	if !r.Checks["redis"].OK || !r.Checks["postgres"].OK {
		t.Errorf("passing checks reported as failing: %+v", r)
	}

	a.AddCheck("broken", func(context.Context) error { return nil })
	a.AddCheck("slow", func(context.Context) error { return nil })
	if code, _ := getReady(t, base); code != http.StatusOK {
		t.Errorf("readyz after the checks recovered: %d", code)
	}
	a.Drain()
	if code, r := getReady(t, base); code != http.StatusServiceUnavailable || r.Status != "draining" {
		t.Errorf("readyz while draining: %d %+v", code, r)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz while draining: %d", code)
	}
}

func TestAdminCheckPanics(t *testing.T) {
	a, base := startAdmin(t, service.AdminConfig{})
	a.AddCheck("panics", func(context.Context) error { panic("boom") })
	a.MarkReady()
	code, r := getReady(t, base)
	if code != http.StatusServiceUnavailable || !strings.Contains(r.Checks["panics"].Error, "boom") {
		t.Errorf("readyz with a panicking check: %d %+v", code, r)
	}
}

func TestAdminMetrics(t *testing.T) {
	reg := service.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "admin_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	a, base := startAdmin(t, service.AdminConfig{Registry: reg})
	if a.Registry() != reg {
		t.Error("Registry() is not the configured registry")
	}
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	for _, want := range []string{"admin_test_things_total 3", "go_goroutines", "process_start_time_seconds", "promhttp_metric_handler_requests_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Only GET (and HEAD) are served.
	resp, err := client().Post(base+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d", resp.StatusCode)
	}
}

func TestAdminStartStop(t *testing.T) {
	logger := zerolog.New(zerolog.NewTestWriter(t))
	if _, err := service.NewAdmin(service.AdminConfig{}); err == nil {
		t.Error("NewAdmin without an address succeeded")
	}
	a, err := service.NewAdmin(service.AdminConfig{Addr: "127.0.0.1:0", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Errorf("Stop before Start: %v", err)
	}

	b, base := startAdmin(t, service.AdminConfig{})
	if err := b.Start(context.Background()); err == nil {
		t.Error("second Start succeeded")
	}
	busy, err := service.NewAdmin(service.AdminConfig{Addr: b.Addr(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Start on a busy address: %v", err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := client().Get(base + "/healthz"); err == nil {
		t.Error("server still answers after Stop")
	}
}

func TestAdminRun(t *testing.T) {
	a, err := service.NewAdmin(service.AdminConfig{Addr: "127.0.0.1:0", Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	// Run starts the server itself; wait until it listens.
	testenv.WaitFor(t, 10*time.Second, "the admin server to listen", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		return a.Addr() != ""
	})
	base := "http://" + a.Addr()
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
	if _, err := client().Get(base + "/healthz"); err == nil {
		t.Error("server still answers after Run returned")
	}
}
