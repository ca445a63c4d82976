package auth

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Authenticator checks the keys of requests. A key found valid is cached
// for CacheTTL, so a busy client costs one database write per TTL (which
// also records last use); a revocation therefore takes effect on other
// replicas within CacheTTL, and at once on the replica that revoked.
type Authenticator struct {
	store *Store
	ttl   time.Duration
	now   func() time.Time

	mu    sync.Mutex
	cache map[string]cached // by hash
}

type cached struct {
	key     *Key
	err     error // ErrNotFound or ErrRevoked
	expires time.Time
}

// maxCached bounds the cache; it is emptied when full (a flood of unknown
// keys must not grow memory).
const maxCached = 10_000

// NewAuthenticator returns an Authenticator on store; ttl <= 0 disables
// the cache.
func NewAuthenticator(store *Store, ttl time.Duration) *Authenticator {
	return &Authenticator{store: store, ttl: ttl, now: time.Now, cache: map[string]cached{}}
}

// Authenticate returns the live key whose secret is given: ErrNotFound for
// a malformed or unknown key, ErrRevoked for a revoked one.
func (a *Authenticator) Authenticate(ctx context.Context, secret string) (*Key, error) {
	if !WellFormed(secret) {
		return nil, ErrNotFound
	}
	hash := Hash(secret)
	now := a.now()
	if a.ttl > 0 {
		a.mu.Lock()
		c, ok := a.cache[string(hash)]
		a.mu.Unlock()
		if ok && now.Before(c.expires) {
			return c.key, c.err
		}
	}
	k, err := a.store.Use(ctx, hash)
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrRevoked) {
		return nil, err // a database error is not cached
	}
	if a.ttl > 0 {
		a.mu.Lock()
		if len(a.cache) >= maxCached {
			clear(a.cache)
		}
		a.cache[string(hash)] = cached{key: k, err: err, expires: now.Add(a.ttl)}
		a.mu.Unlock()
	}
	return k, err
}

// Forget drops a key from the cache (after revoking it here).
func (a *Authenticator) Forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for h, c := range a.cache {
		if c.key != nil && c.key.ID == id {
			delete(a.cache, h)
		}
	}
}
