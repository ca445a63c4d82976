package detect_test

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2/ec2test"
)

// TestSpecialAddressesRefused: provider data is input. The Time4VPS
// stand-in answers loopback, metadata, unspecified and IPv6 loopback
// addresses next to normal ones, the inventory has a malformed and a
// metadata ansible_host and one aimed at a loopback listener, EC2 a
// metadata address: none of those is registered, each is counted and
// reported, nothing is dialled, and the rest of every source registers
// (the allow-listed loopback test target too).
func TestSpecialAddressesRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dialled atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	// This host is 127.0.0.1/8 and 198.51.100.77/24; the operator lets
	// the test target 127.0.0.2 through.
	guard := testGuard(t, []string{"127.0.0.2/32"}, "127.0.0.1/8", "198.51.100.77/24")
	reg := prometheus.NewRegistry()
	w := setupWith(t, detect.Options{Guard: guard, Registerer: reg})
	w.writeInventory(t, "web-1: {ansible_host: 192.0.2.1}\n"+
		"        bad-host: {ansible_host: 'not_a_host!'}\n"+
		"        meta: {ansible_host: 169.254.169.254}\n"+
		"        loop: {ansible_host: 127.0.0.1, ansible_port: "+strconv.Itoa(port)+"}\n"+
		"        web-2: {ansible_host: 192.0.2.2}\n")
	for id, ip := range map[int64]string{201: "127.0.0.1", 202: "169.254.169.254", 203: "0.0.0.0", 204: "::1",
		205: "198.51.100.20", 206: "127.0.0.2", 207: "198.51.100.77", 208: "198.51.100.255", 209: "fe80::1", 210: "224.0.0.1"} {
		w.t4v.AddServer(time4vpstest.VPS{ID: id, IP: ip})
	}
	w.ec2.Add(ec2test.Instance{ID: "i-0cccccccccccccccc", PublicIP: "169.254.169.254"})
	w.ec2.Add(ec2test.Instance{ID: "i-0dddddddddddddddd", PublicIP: "203.0.113.9"})

	rep := w.sync(t)
	if err := rep.Err(); err != nil {
		t.Fatalf("a refused host failed its source: %v", err)
	}
	refused := map[string]string{}
	for _, s := range rep.Sources {
		for _, r := range s.Refused {
			refused[r.Handle] = r.Class
		}
	}
	want := map[string]string{"bad-host": detect.ClassInvalidAddress, "meta": authz.ClassMetadata, "loop": authz.ClassLoopback,
		"time4vps-201": authz.ClassLoopback, "time4vps-202": authz.ClassMetadata, "time4vps-203": authz.ClassUnspecified,
		"time4vps-204": authz.ClassLoopback, "time4vps-207": authz.ClassOwnAddress, "time4vps-208": authz.ClassBroadcast,
		"time4vps-209": authz.ClassLinkLocal, "time4vps-210": authz.ClassMulticast, "i-0cccccccccccccccc": authz.ClassMetadata}
	for h, class := range want {
		if refused[h] != class {
			t.Errorf("%s: refused as %q, want %q", h, refused[h], class)
		}
		if _, err := w.fleet.Get(t.Context(), h); err == nil {
			t.Errorf("%s was registered", h)
		}
	}
	if len(refused) != len(want) {
		t.Errorf("refused %v, want %v", refused, want)
	}
	for _, h := range []string{"web-1", "web-2", "time4vps-205", "time4vps-206", "i-0dddddddddddddddd"} {
		if s := w.get(t, h); s.Status != fleet.StatusNew {
			t.Errorf("%s: %s, want NEW", h, s.Status)
		}
	}
	if got := refusedCount(t, reg, "time4vps", "loopback"); got != 2 {
		t.Errorf("refused{time4vps,loopback} = %v, want 2", got)
	}
	if got := refusedCount(t, reg, w.inv.Name(), "invalid_address"); got != 1 {
		t.Errorf("refused{inventory,invalid_address} = %v, want 1", got)
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("the refused loopback host was dialled %d times", n)
	}
}

// refusedCount returns the refusal counter of source and reason in reg.
func refusedCount(t *testing.T, reg *prometheus.Registry, source, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "autoprov_scheduler_source_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] == source && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
