package auth

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestAuthenticatorCacheRevocationBound: a key revoked on another replica
// (straight in the database, which this authenticator does not see) is
// refused once the cached check is older than the TTL; the replica that
// revokes forgets the key at once; the last use is recorded once per TTL
// while the key is cached.
func TestAuthenticatorCacheRevocationBound(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	store := NewStore(db)
	ctx := context.Background()
	k, secret, err := store.Create(ctx, NewKey{Name: "ci", Scopes: []Scope{ScopeDeploymentsWrite}, FleetWide: true})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 5 * time.Second
	clock := time.Now()
	var mu sync.Mutex
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	a := NewAuthenticator(store, ttl)
	a.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	lastUsed := func() time.Time {
		got, err := store.Get(ctx, k.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.LastUsedAt
	}

	if got, err := a.Authenticate(ctx, secret); err != nil || got.ID != k.ID {
		t.Fatalf("live key: %+v, %v", got, err)
	}
	used := lastUsed()
	if used.IsZero() {
		t.Fatal("last use not recorded")
	}
	if _, err := store.Revoke(ctx, k.ID); err != nil { // another replica revokes it
		t.Fatal(err)
	}
	// Within the TTL the cached check still stands (the documented bound)
	// and costs no write.
	advance(ttl - time.Millisecond)
	if _, err := a.Authenticate(ctx, secret); err != nil {
		t.Fatalf("within the TTL: %v", err)
	}
	if !lastUsed().Equal(used) {
		t.Error("a cached check wrote the last use again")
	}
	// Past the TTL the revocation is seen.
	advance(2 * time.Millisecond)
	if _, err := a.Authenticate(ctx, secret); !errors.Is(err, ErrRevoked) {
		t.Fatalf("past the TTL: %v, want ErrRevoked", err)
	}

	// On the replica that revokes, Forget makes it immediate.
	k2, secret2, err := store.Create(ctx, NewKey{Name: "ci2", Scopes: []Scope{ScopeDeploymentsWrite}, FleetWide: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, secret2); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Revoke(ctx, k2.ID); err != nil {
		t.Fatal(err)
	}
	a.Forget(k2.ID)
	if _, err := a.Authenticate(ctx, secret2); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after Forget: %v, want ErrRevoked", err)
	}
}
