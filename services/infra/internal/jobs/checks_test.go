package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestEndpointKeysAreCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ep   endpoint
		want endpointKey
	}{
		{endpoint{address: "192.0.2.1", port: 0, user: "root"}, endpointKey{"192.0.2.1", 22, "root"}},
		{endpoint{address: "::ffff:192.0.2.1", port: 22, user: "root"}, endpointKey{"192.0.2.1", 22, "root"}},
		{endpoint{address: "2001:DB8:0:0::1", port: 2222, user: "deploy"}, endpointKey{"2001:db8::1", 2222, "deploy"}},
		{endpoint{address: "[2001:db8::1]", port: 22, user: "deploy"}, endpointKey{"2001:db8::1", 22, "deploy"}},
		{endpoint{address: "Web-1.Example.COM.", port: 22, user: "root"}, endpointKey{"web-1.example.com", 22, "root"}},
	}
	for _, tt := range tests {
		if got := keyOf(tt.ep); got != tt.want {
			t.Errorf("keyOf(%+v) = %+v, want %+v", tt.ep, got, tt.want)
		}
	}
	// The user is part of the key: root's check says nothing of deploy's.
	if keyOf(endpoint{address: "192.0.2.1", user: "root"}) == keyOf(endpoint{address: "192.0.2.1", user: "deploy"}) {
		t.Error("users share a key")
	}
}

// TestPassedChecks runs the reuse rules on one process's record, and on the
// shared record another replica writes (a fresh passedChecks on the same
// Redis reads what the first passed and forgot).
func TestPassedChecks(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(testenv.RedisDB(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "shared"}[shared], func(t *testing.T) {
			testPassedChecks(t, rdb, shared)
		})
	}
}

func testPassedChecks(t *testing.T, rdb redis.UniversalClient, shared bool) {
	ctx := context.Background()
	const host = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOne"
	k := endpointKey{"192.0.2.1", 22, "root"}
	if shared {
		k.user = "shared" // its own Redis key
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var writerRDB redis.UniversalClient
	if shared {
		writerRDB = rdb
	}
	p := newPassedChecks(5*time.Second, writerRDB)
	reader := p // the replica that reuses
	if shared {
		reader = newPassedChecks(5*time.Second, rdb)
	}
	if _, ok := reader.reuse(ctx, k, host, "fp", t0); ok {
		t.Fatal("reused a check that never ran")
	}
	p.pass(ctx, k, host+" comment", "fp", t0)
	tests := []struct {
		name    string
		key     endpointKey
		hostKey string
		clients string
		at      time.Time
		want    bool
	}{
		{"same, within the window", k, host, "fp", t0.Add(5 * time.Second), true},
		{"past the window", k, host, "fp", t0.Add(5*time.Second + 1), false},
		{"clock went back", k, host, "fp", t0.Add(-time.Second), false},
		{"another host key", k, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyTwo", "fp", t0, false},
		{"no pinned key", k, "", "fp", t0, false},
		{"other client keys", k, host, "fp2", t0, false},
		{"another port", endpointKey{"192.0.2.1", 2222, k.user}, host, "fp", t0, false},
	}
	for _, tt := range tests {
		if _, ok := reader.reuse(ctx, tt.key, tt.hostKey, tt.clients, tt.at); ok != tt.want {
			t.Errorf("%s: reuse = %v, want %v", tt.name, ok, tt.want)
		}
	}
	p.forget(ctx, k)
	if _, ok := reader.reuse(ctx, k, host, "fp", t0); ok {
		t.Error("reused a forgotten check")
	}
	if shared {
		// A failure seen by the reader makes the writer check again too.
		p.pass(ctx, k, host, "fp", t0)
		reader.forget(ctx, k)
		other := newPassedChecks(5*time.Second, rdb)
		if _, ok := other.reuse(ctx, k, host, "fp", t0); ok {
			t.Error("a third replica reused a check another one forgot")
		}
		return
	}
	// Stale entries go when another passes; a zero window never keeps any.
	p.pass(ctx, k, host, "fp", t0)
	p.pass(ctx, endpointKey{"192.0.2.2", 22, "root"}, host, "fp", t0.Add(time.Minute))
	if len(p.passed) != 1 {
		t.Errorf("%d entries kept, want the fresh one only", len(p.passed))
	}
	off := newPassedChecks(0, nil)
	off.pass(ctx, k, host, "fp", t0)
	if _, ok := off.reuse(ctx, k, host, "fp", t0); ok || len(off.passed) != 0 {
		t.Error("a zero window reused a check")
	}
}
