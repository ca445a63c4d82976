package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// tripwire is a TCP listener on loopback that counts the connections it
// gets: a refused target's port, which must never be dialled.
func tripwire(t *testing.T) (port int, dialled *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	dialled = new(atomic.Int64)
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
	return ln.Addr().(*net.TCPAddr).Port, dialled
}

// TestAttackProvisionSpecialAddressRefused: servers registered (by a
// provider listing or an inventory) at the metadata address or loopback,
// with SPECIAL_ALLOW_NETWORKS empty, are refused when a ProvisionerMessage
// names them: a rejected result saying why, a dead letter, no SSH attempt,
// no packet to the loopback listener. A deploy to the registered loopback
// server is refused the same way (registered servers no longer skip the
// refusal).
func TestAttackProvisionSpecialAddressRefused(t *testing.T) {
	t.Parallel()
	e := newE2E(t, nil)
	// A usable key: without the refusal, infra would get as far as dialling.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	e.sshKey = pem.EncodeToMemory(blk)
	port, dialled := tripwire(t)
	for _, s := range []struct {
		handle, addr string
		port         int
	}{{"meta-srv", "169.254.169.254", 22}, {"loop-srv", "127.0.0.1", port}, {"loop6-srv", "::1", port}} {
		if _, err := e.pool.Exec(context.Background(),
			`INSERT INTO servers (handle, address, ssh_port, ssh_user) VALUES ($1, $2, $3, 'root')`, s.handle, s.addr, s.port); err != nil {
			t.Fatal(err)
		}
	}
	p := e.infra("SPECIAL_ALLOW_NETWORKS=")
	want := map[string]string{"prov-meta": "cloud metadata", "prov-loop": "loopback", "prov-loop6": "loopback"}
	e.provision("prov-meta", "meta-srv")
	e.provision("prov-loop", "loop-srv")
	e.provision("prov-loop6", "loop6-srv")
	e.deploy("dep-loop", "127.0.0.1", "", "")
	for id, reason := range want {
		r := e.waitProvision(id, 3*time.Minute)
		if r.Status != messages.StatusRejected || r.Error == nil || r.Error.Kind != messages.KindInvalidMessage ||
			!strings.Contains(r.Error.Message, "refused") || !strings.Contains(r.Error.Message, reason) {
			t.Errorf("%s: result %s %+v, want rejected naming %q", id, r.Status, r.Error, reason)
		}
	}
	if r := e.waitDeploy("dep-loop"); r.Status != messages.StatusUnreachable {
		t.Errorf("deploy to the registered loopback server: %s %+v, want unreachable", r.Status, r.Error)
	}
	ctx := context.Background()
	var dead []string
	for _, d := range e.rdb.XRange(ctx, messages.StreamProvisionerQueue+stream.DeadLetterSuffix, "-", "+").Val() {
		if d.Values["dead_reason"] != "target_refused" {
			t.Errorf("dead letter reason %v, want target_refused", d.Values["dead_reason"])
		}
		dead = append(dead, d.ID)
	}
	if len(dead) != 3 {
		t.Errorf("%d provisioning dead letters, want 3", len(dead))
	}
	var runs int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM runs WHERE kind = 'provision'`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if runs != 0 {
		t.Errorf("%d provisioning runs, want none: the refusal comes before the run", runs)
	}
	if n := p.sshAttempts(t); n != 0 {
		t.Errorf("%v SSH check attempts, want none", n)
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("the refused loopback target was dialled %d times", n)
	}
}
