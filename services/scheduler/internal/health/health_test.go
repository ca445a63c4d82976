package health_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/health"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

func TestRecoveryAfterFailuresWithCooldown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Pool(t)
	clk := clocktest.NewFake(time.Now())
	f := fleet.New(db, fleet.Options{Now: clk.Now})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, status) VALUES ('s', '127.0.0.1', $1, 'READY')`, port); err != nil {
		t.Fatal(err)
	}
	var flagged atomic.Int32
	c := health.New(f, nil, health.Config{Failures: 3, Cooldown: 30 * time.Minute, Timeout: time.Second,
		Flagged: func() { flagged.Add(1) }})
	round := func() {
		t.Helper()
		if err := c.Round(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	requested := func() fleet.Action {
		s, err := f.Get(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		return s.RequestedAction
	}
	round()
	_ = l.Close() // the SSH port stops answering
	round()
	round()
	if requested() != "" {
		t.Fatal("flagged before 3 consecutive failures")
	}
	round()
	if requested() != fleet.ActionRecovery || flagged.Load() != 1 {
		t.Fatalf("not flagged after 3 failures: %q", requested())
	}
	due, _ := f.Due(ctx, 10)
	if len(due) != 1 || due[0].Action != fleet.ActionRecovery || due[0].RequestedBy != health.Actor {
		t.Fatalf("due: %+v", due)
	}
	// The recovery runs and succeeds, but the port stays closed: within
	// the cool-down the server is not flagged again.
	srv, _ := f.Get(ctx, "s")
	if q, err := f.Queue(ctx, []fleet.Job{{Handle: "s", Version: srv.Version, Action: fleet.ActionRecovery, JobID: "rec-1", Payload: []byte{0x80}}}, "t"); err != nil || len(q) != 1 {
		t.Fatal(q, err)
	}
	if _, _, err := f.ApplyResult(ctx, fleet.Result{Handle: "s", JobID: "rec-1", Status: messages.StatusSucceeded}, "t", fleet.RetryPolicy{Limit: 3}); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		round()
	}
	if requested() != "" || flagged.Load() != 1 {
		t.Fatalf("flagged again within the cool-down: %q", requested())
	}
	clk.Advance(31 * time.Minute)
	for range 3 {
		round()
	}
	if requested() != fleet.ActionRecovery || flagged.Load() != 2 {
		t.Errorf("not flagged after the cool-down: %q", requested())
	}
	// Paused servers are not probed (and so never flagged).
	if _, err := f.Pause(ctx, "s", "op", ""); err != nil {
		t.Fatal(err)
	}
}

// TestHealthURLAndBoundedConcurrency: the rules' health URL is probed too,
// and no more than Concurrency probes run at once.
func TestHealthURLAndBoundedConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Pool(t)
	f := fleet.New(db, fleet.Options{})
	var cur, peak atomic.Int32
	var bad atomic.Bool
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		cur.Add(-1)
		if bad.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer hs.Close()
	_, port, _ := net.SplitHostPort(hs.Listener.Addr().String())
	for i := range 40 {
		if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, status, labels) VALUES ($1, '127.0.0.1', $2, 'READY', '{"web": "yes"}')`,
			fmt.Sprintf("w%02d", i), port); err != nil {
			t.Fatal(err)
		}
	}
	set, err := rules.Parse("r.yml", []byte(`rules:
  - name: web health
    match: {all: [{label: web}]}
    settings: {health_url: "http://{address}:`+port+`/healthz?server={handle}"}
`), "")
	if err != nil {
		t.Fatal(err)
	}
	c := health.New(f, func() *rules.Set { return set }, health.Config{Concurrency: 4, Failures: 1, Timeout: 5 * time.Second})
	if err := c.Round(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p < 1 || p > 4 {
		t.Errorf("peak concurrency %d, want 1..4", p)
	}
	if n, _ := f.Count(ctx, fleet.Filter{Requested: true}); n[fleet.StatusReady] != 0 {
		t.Errorf("healthy servers flagged: %v", n)
	}
	bad.Store(true) // the TCP port answers, the health URL says 503
	if err := c.Round(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.Count(ctx, fleet.Filter{Requested: true}); n[fleet.StatusReady] != 40 {
		t.Errorf("%d servers flagged after a failing health URL, want 40", n[fleet.StatusReady])
	}
}
