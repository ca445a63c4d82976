package detect_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/inventory"
)

// TestOrphanGuardSmallInventory walks the real sync path (ansible-inventory,
// the Manager, fleet.Sync on Postgres) with a 3-server inventory that is
// emptied, then cut to one host: nothing is orphaned, the source fails with
// a log line and a metric that say why and what to do. Removing one host at
// a time works, and MAX_ORPHAN_FRACTION=1 lets the operator remove the rest.
func TestOrphanGuardSmallInventory(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	f := fleet.New(db, fleet.Options{})
	path := filepath.Join(t.TempDir(), "hosts.yml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hosts := func(names ...string) string {
		var b strings.Builder
		b.WriteString("all:\n  hosts:\n")
		for i, n := range names {
			b.WriteString("    " + n + ": {ansible_host: 203.0.113." + string(rune('1'+i)) + "}\n")
		}
		return b.String()
	}
	inv, err := inventory.New(path, "")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	newManager := func(fraction float64, reg prometheus.Registerer) *detect.Manager {
		m, err := detect.NewManager(f, []detect.Detector{inv}, detect.Options{MaxOrphanFraction: fraction,
			Logger: zerolog.New(&logs), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	mgr := newManager(0.5, reg)
	sync := func(m *detect.Manager) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		rep, err := m.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Sources[0].Err
	}
	statuses := func() map[string]string {
		t.Helper()
		page, err := f.List(context.Background(), fleet.Filter{}, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range page.Servers {
			out[s.Handle] = s.Status
		}
		return out
	}
	live := func() int {
		n := 0
		for _, st := range statuses() {
			if st != fleet.StatusOrphaned {
				n++
			}
		}
		return n
	}

	write(hosts("web-1", "web-2", "web-3"))
	if err := sync(mgr); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 3 {
		t.Fatalf("%d live servers, want 3: %v", n, statuses())
	}
	for i, c := range []struct{ name, content string }{
		{"emptied", "all: {}\n"},
		{"zero bytes", ""},
		{"cut to one host", hosts("web-1")},
	} {
		logs.Reset()
		write(c.content)
		err := sync(mgr)
		if err == nil || !strings.Contains(err.Error(), "orphan") || !strings.Contains(err.Error(), "MAX_ORPHAN_FRACTION") {
			t.Errorf("%s: source error %v, want the orphan guard naming MAX_ORPHAN_FRACTION", c.name, err)
		}
		if st := statuses(); live() != 3 {
			t.Errorf("%s: servers orphaned: %v", c.name, st)
		}
		if !strings.Contains(logs.String(), `"level":"error"`) || !strings.Contains(logs.String(), "would orphan too many servers") {
			t.Errorf("%s: log %s", c.name, logs.String())
		}
		want := float64(i + 1)
		if got := counterValue(t, reg, "autoprov_scheduler_source_orphan_guard_refusals_total", inv.Name()); got != want {
			t.Errorf("%s: refusals metric %g, want %g", c.name, got, want)
		}
	}
	// One host at a time works, down to the last one; the last needs the
	// operator's MAX_ORPHAN_FRACTION=1.
	write(hosts("web-1", "web-2"))
	if err := sync(mgr); err != nil {
		t.Fatalf("removing one of 3: %v", err)
	}
	write(hosts("web-1"))
	if err := sync(mgr); err != nil {
		t.Fatalf("removing one of 2: %v", err)
	}
	write("all: {}\n")
	if err := sync(mgr); err == nil {
		t.Fatal("the last server was orphaned by default")
	}
	if err := sync(newManager(1, nil)); err != nil {
		t.Fatalf("MAX_ORPHAN_FRACTION=1: %v", err)
	}
	if st := statuses(); live() != 0 || len(st) != 3 {
		t.Errorf("after the confirmed removal: %v", st)
	}
}

// counterValue reads the counter name{source} from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, source string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == source {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
