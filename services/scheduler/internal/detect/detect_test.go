package detect_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	t4v "github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2/ec2test"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/inventory"
	dt4v "github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/time4vps"
)

// TestMain keeps the AWS SDK off any instance metadata service, for every
// test at once: t.Setenv would keep the tests from running in parallel.
func TestMain(m *testing.M) {
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Exit(m.Run())
}

type world struct {
	fleet   *fleet.Store
	mgr     *detect.Manager
	invPath string
	t4v     *time4vpstest.Server
	ec2     *ec2test.Server
	inv     *inventory.Detector
}

func setup(t *testing.T) *world {
	t.Helper()
	return setupWith(t, detect.Options{Guard: testGuard(t, nil, "127.0.0.1/8")})
}

// testGuard is a special-address guard over this host's addresses ifaces
// (not the test machine's: they may be in the documentation ranges).
func testGuard(t *testing.T, allow []string, ifaces ...string) *authz.Guard {
	t.Helper()
	g, err := authz.NewGuard(authz.SpecialConfig{AllowNetworks: allow}, authz.Options{InterfaceAddrs: func() ([]net.Addr, error) {
		var out []net.Addr
		for _, a := range ifaces {
			ip, n, err := net.ParseCIDR(a)
			if err != nil {
				return nil, err
			}
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// setupWith is setup with the Manager's options.
func setupWith(t *testing.T, opts detect.Options) *world {
	t.Helper()
	db := testenv.Pool(t)
	w := &world{fleet: fleet.New(db, fleet.Options{})}
	w.invPath = filepath.Join(t.TempDir(), "hosts.yml")
	w.writeInventory(t, "web-1: {ansible_host: 192.0.2.1}\n        web-2: {ansible_host: 192.0.2.2}\n        shared: {ansible_host: 192.0.2.50}\n        manual-dup: {ansible_host: 192.0.2.9}\n")
	inv, err := inventory.New(w.invPath, "")
	if err != nil {
		t.Fatal(err)
	}
	w.inv = inv
	w.t4v = time4vpstest.Start(t, time4vpstest.Config{Username: "u@example.com", Password: "pw"})
	client, err := t4v.New(t4v.Config{URL: w.t4v.URL(), Username: "u@example.com", Password: "pw", RetryMax: -1}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	w.ec2 = ec2test.New("eu-west-1", "AKIDTEST", "secret")
	t.Cleanup(w.ec2.Close)
	ed, err := ec2.New(context.Background(), ec2.Config{Region: "eu-west-1", Endpoint: w.ec2.URL(), AccessKeyID: "AKIDTEST",
		SecretAccessKey: "secret", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Precedence: the inventory first, then Time4VPS, then EC2.
	w.mgr, err = detect.NewManager(w.fleet, []detect.Detector{inv, dt4v.New(client, ""), ed}, opts)
	if err != nil {
		t.Fatal(err)
	}
	// A manual server.
	if _, err := db.Exec(context.Background(), `INSERT INTO servers (handle, address) VALUES ('manual-1', '192.0.2.9')`); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *world) writeInventory(t *testing.T, hosts string) {
	t.Helper()
	content := "all:\n  children:\n    web:\n      hosts:\n        " + hosts
	if err := os.WriteFile(w.invPath, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (w *world) sync(t *testing.T) detect.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := w.mgr.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func (w *world) get(t *testing.T, h string) *fleet.Server {
	t.Helper()
	s, err := w.fleet.Get(context.Background(), h)
	if err != nil {
		t.Fatalf("%s: %v", h, err)
	}
	return s
}

func (w *world) count(t *testing.T) int {
	t.Helper()
	c, err := w.fleet.Count(context.Background(), fleet.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

func TestDetectionDedupOrphaning(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.t4v.AddServer(time4vpstest.VPS{ID: 101, IP: "198.51.100.1", Domain: "vps1.example.com", OS: "kvm-debian-12-x86_64"})
	w.t4v.AddServer(time4vpstest.VPS{ID: 102, IP: "192.0.2.50", Domain: "same-as-shared.example.com"}) // address of inventory's "shared"
	w.ec2.Add(ec2test.Instance{ID: "i-0aaaaaaaaaaaaaaaa", PublicIP: "203.0.113.7", Tags: map[string]string{"Name": "api"}})
	w.ec2.Add(ec2test.Instance{ID: "i-0bbbbbbbbbbbbbbbb", PublicIP: "198.51.100.1"}) // address of time4vps-101

	rep := w.sync(t)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	// inventory: web-1, web-2, shared (manual-dup loses to the manual server's address);
	// time4vps: time4vps-101 (102 is a duplicate of shared); ec2: i-0aaa (i-0bbb duplicates time4vps-101).
	for h, src := range map[string]string{"web-1": w.inv.Name(), "web-2": w.inv.Name(), "shared": w.inv.Name(),
		"time4vps-101": "time4vps", "i-0aaaaaaaaaaaaaaaa": "ec2", "manual-1": "manual"} {
		if s := w.get(t, h); s.Source != src || s.Status != fleet.StatusNew {
			t.Errorf("%s: source %s status %s, want %s NEW", h, s.Source, s.Status, src)
		}
	}
	if n := w.count(t); n != 6 {
		t.Errorf("%d servers, want 6", n)
	}
	dups := map[string]int{}
	for _, s := range rep.Sources {
		dups[s.Source] = s.Duplicates
	}
	if dups[w.inv.Name()] != 1 || dups["time4vps"] != 1 || dups["ec2"] != 1 {
		t.Errorf("duplicates %v", dups)
	}
	if s := w.get(t, "time4vps-101"); s.ProviderID != "101" || s.Labels["time4vps:os"] != "kvm-debian-12-x86_64" || s.Labels["time4vps:domain"] != "vps1.example.com" {
		t.Errorf("time4vps server: %+v", s)
	}
	if s := w.get(t, "i-0aaaaaaaaaaaaaaaa"); s.Labels["Name"] != "api" || s.Address != "203.0.113.7" {
		t.Errorf("ec2 server: %+v", s)
	}

	// web-2 becomes READY; then vanishes from the inventory: ORPHANED.
	if _, err := w.fleet.Transition(context.Background(), fleet.TransitionRequest{Handle: "web-2", To: fleet.StatusReady, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	w.writeInventory(t, "web-1: {ansible_host: 192.0.2.1}\n        shared: {ansible_host: 192.0.2.50}\n")
	w.sync(t)
	if s := w.get(t, "web-2"); s.Status != fleet.StatusOrphaned || s.OrphanedFrom != fleet.StatusReady {
		t.Errorf("vanished: %+v", s)
	}
	// Failing sources change nothing: the inventory is unreadable, Time4VPS
	// answers 500, EC2 refuses; nobody is orphaned.
	if err := os.WriteFile(w.invPath, []byte("all: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.t4v.FailNext(time4vpstest.EndpointListServers, 1, 500)
	w.ec2.FailNext(1, 503, "Unavailable", "down")
	rep = w.sync(t)
	for _, s := range rep.Sources {
		if s.Err == nil {
			t.Errorf("source %s did not fail", s.Source)
		}
	}
	for _, h := range []string{"web-1", "shared", "time4vps-101", "i-0aaaaaaaaaaaaaaaa"} {
		if s := w.get(t, h); s.Status != fleet.StatusNew {
			t.Errorf("%s is %s after its source failed", h, s.Status)
		}
	}
	// A source answering an empty list would orphan its whole fleet: refused.
	w.writeInventory(t, "{}\n")
	if err := os.WriteFile(w.invPath, []byte("all: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep = w.sync(t)
	if err := rep.Sources[0].Err; err == nil || !strings.Contains(err.Error(), "orphan") {
		t.Errorf("empty inventory: %v", err)
	}
	// web-2 comes back: READY again, with its history.
	w.writeInventory(t, "web-1: {ansible_host: 192.0.2.1}\n        web-2: {ansible_host: 192.0.2.2}\n        shared: {ansible_host: 192.0.2.50}\n")
	w.sync(t)
	if s := w.get(t, "web-2"); s.Status != fleet.StatusReady {
		t.Errorf("returned: %+v", s)
	}
	hist, _ := w.fleet.History(context.Background(), "web-2", 10)
	if len(hist) < 3 || hist[0].Event != fleet.EventReturned || hist[1].Event != fleet.EventOrphaned {
		t.Errorf("history %+v", hist)
	}
	// The inventory drops "shared": Time4VPS lists the same machine (102),
	// which now wins it instead of orphaning anything... under its own handle.
	w.writeInventory(t, "web-1: {ansible_host: 192.0.2.1}\n        web-2: {ansible_host: 192.0.2.2}\n")
	w.sync(t)
	if s := w.get(t, "shared"); s.Status != fleet.StatusOrphaned {
		t.Errorf("shared: %s", s.Status)
	}
	if s := w.get(t, "time4vps-102"); s.Source != "time4vps" {
		t.Errorf("time4vps-102: %+v", s)
	}
}
