package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func addServer(t *testing.T, pool *pgxpool.Pool, handle, address string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO servers (handle, address) VALUES ($1, $2)`, handle, address); err != nil {
		t.Fatalf("insert server %s: %v", handle, err)
	}
}

func TestGetServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, ssh_user, labels, source, provider_id, ssh_key_ref)
		VALUES ('web-1', '192.0.2.10', 2222, 'deploy', '{"role":"web","env":"prod"}', 'time4vps', '4711', 'vault:kv/ssh#key')`)
	if err != nil {
		t.Fatal(err)
	}
	addServer(t, pool, "bare", "192.0.2.11")

	s, err := store.GetServer(ctx, pool, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Handle != "web-1" || s.Address != "192.0.2.10" || s.SSHPort != 2222 || s.SSHUser != "deploy" ||
		s.Status != store.ServerNew || s.Source != "time4vps" || s.ProviderID != "4711" ||
		s.SSHKeyRef != "vault:kv/ssh#key" || s.Version != 1 || s.CreatedAt.IsZero() {
		t.Fatalf("server = %+v", s)
	}
	if len(s.Labels) != 2 || s.Labels["role"] != "web" || s.Labels["env"] != "prod" {
		t.Fatalf("labels = %v", s.Labels)
	}

	// NULL columns read as documented zero values.
	b, err := store.GetServer(ctx, pool, "bare")
	if err != nil {
		t.Fatal(err)
	}
	if b.ProviderID != "" || b.SSHKeyRef != "" || b.HostKey != "" || !b.HostKeyPinnedAt.IsZero() ||
		b.LastError != "" || b.LastJobID != "" || b.Labels == nil || b.SSHPort != 22 || b.SSHUser != "root" {
		t.Fatalf("bare server = %+v", b)
	}

	if _, err := store.GetServer(ctx, pool, "nope"); !errors.Is(err, store.ErrServerNotFound) {
		t.Fatalf("missing server: err = %v, want ErrServerNotFound", err)
	}
}

func TestFindServerByAddress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "web-1", "192.0.2.10")
	addServer(t, pool, "v6", "2001:db8::1")
	addServer(t, pool, "shared-a", "198.51.100.7")
	addServer(t, pool, "shared-b", "198.51.100.7")

	for _, tc := range []struct{ address, want string }{
		{"192.0.2.10", "web-1"},
		{"2001:db8::1", "v6"},
		{"2001:DB8:0::0:1", "v6"}, // another spelling of the same IP
	} {
		s, err := store.FindServerByAddress(ctx, pool, tc.address)
		if err != nil {
			t.Fatalf("%s: %v", tc.address, err)
		}
		if s.Handle != tc.want {
			t.Fatalf("%s: found %s, want %s", tc.address, s.Handle, tc.want)
		}
	}
	if _, err := store.FindServerByAddress(ctx, pool, "203.0.113.1"); !errors.Is(err, store.ErrServerNotFound) {
		t.Fatalf("unknown address: err = %v, want ErrServerNotFound", err)
	}
	_, err := store.FindServerByAddress(ctx, pool, "198.51.100.7")
	var amb *store.AmbiguousAddressError
	if !errors.As(err, &amb) {
		t.Fatalf("shared address: err = %v, want *AmbiguousAddressError", err)
	}
	if amb.Address != "198.51.100.7" || len(amb.Handles) != 2 || amb.Handles[0] != "shared-a" || amb.Handles[1] != "shared-b" {
		t.Fatalf("ambiguity = %+v", amb)
	}
}

func TestAddressAndSSHUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "web-1", "192.0.2.10")

	changed, err := store.SetServerAddress(ctx, pool, "web-1", "192.0.2.99")
	if err != nil || !changed {
		t.Fatalf("set address: changed=%v err=%v", changed, err)
	}
	s, err := store.GetServer(ctx, pool, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Address != "192.0.2.99" || s.Version != 2 {
		t.Fatalf("server = %+v", s)
	}
	// The same address again is no change and no new version.
	if changed, err := store.SetServerAddress(ctx, pool, "web-1", "192.0.2.99"); err != nil || changed {
		t.Fatalf("same address: changed=%v err=%v", changed, err)
	}
	if s, err = store.GetServer(ctx, pool, "web-1"); err != nil || s.Version != 2 {
		t.Fatalf("no-op updates bumped the version: %+v %v", s, err)
	}
	// After setup the server is reached as the deploy user.
	if changed, err := store.SetServerSSHUser(ctx, pool, "web-1", "deploy"); err != nil || !changed {
		t.Fatalf("set ssh user: changed=%v err=%v", changed, err)
	}
	if changed, err := store.SetServerSSHUser(ctx, pool, "web-1", "deploy"); err != nil || changed {
		t.Fatalf("same ssh user: changed=%v err=%v", changed, err)
	}
	if s, err = store.GetServer(ctx, pool, "web-1"); err != nil || s.SSHUser != "deploy" || s.Version != 3 {
		t.Fatalf("after ssh user change: %+v %v", s, err)
	}
	for name, err := range map[string]error{
		"address":   func() error { _, err := store.SetServerAddress(ctx, pool, "nope", "x"); return err }(),
		"ssh user":  func() error { _, err := store.SetServerSSHUser(ctx, pool, "nope", "x"); return err }(),
		"clear key": store.ClearServerHostKey(ctx, pool, "nope"),
		"pin key":   func() error { _, err := store.PinServerHostKey(ctx, pool, "nope", "ssh-ed25519 AAAA"); return err }(),
	} {
		if !errors.Is(err, store.ErrServerNotFound) {
			t.Errorf("%s on a missing server: err = %v, want ErrServerNotFound", name, err)
		}
	}
}

// Two instances pin a first-use host key at the same moment: exactly one
// key wins and both are told which.
func TestPinServerHostKeyRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	const rounds = 20
	keyA, keyB := "ssh-ed25519 AAAAkeyA", "ssh-ed25519 AAAAkeyB"
	wins := map[string]int{}
	for i := range rounds {
		handle := fmt.Sprintf("srv-%d", i)
		addServer(t, pool, handle, "192.0.2.10")
		var got [2]string
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, key := range []string{keyA, keyB} {
			wg.Go(func() {
				<-start
				pinned, err := store.PinServerHostKey(ctx, pool, handle, key)
				if err != nil {
					t.Error(err)
				}
				got[j] = pinned
			})
		}
		close(start)
		wg.Wait()
		if got[0] != got[1] || (got[0] != keyA && got[0] != keyB) {
			t.Fatalf("round %d: pinners saw %q and %q, want the same winning key", i, got[0], got[1])
		}
		s, err := store.GetServer(ctx, pool, handle)
		if err != nil {
			t.Fatal(err)
		}
		if s.HostKey != got[0] || s.HostKeyPinnedAt.IsZero() {
			t.Fatalf("round %d: stored key %q (pinned at %v), pinners saw %q", i, s.HostKey, s.HostKeyPinnedAt, got[0])
		}
		wins[got[0]]++
	}
	t.Logf("wins over %d rounds: %v", rounds, wins)

	// Pinned keys are kept; clearing allows a new first use.
	if pinned, err := store.PinServerHostKey(ctx, pool, "srv-0", "ssh-ed25519 AAAAother"); err != nil || pinned == "ssh-ed25519 AAAAother" {
		t.Fatalf("re-pin: pinned=%q err=%v", pinned, err)
	}
	if err := store.ClearServerHostKey(ctx, pool, "srv-0"); err != nil {
		t.Fatal(err)
	}
	if pinned, err := store.PinServerHostKey(ctx, pool, "srv-0", "ssh-ed25519 AAAAother\n"); err != nil || pinned != "ssh-ed25519 AAAAother" {
		t.Fatalf("pin after clear: pinned=%q err=%v", pinned, err)
	}
	if _, err := store.PinServerHostKey(ctx, pool, "srv-0", "  "); err == nil {
		t.Fatal("pinned an empty key")
	}
}
