package auth

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Limiter limits requests per API key with the generic cell rate algorithm
// of redis_rate, whose state lives in Redis: every replica shares each
// key's budget.
//
// A busy key does not cost a Redis round trip per request: a replica takes
// requests from the shared budget in small leases (redis_rate's
// AllowAtMost) and hands them out locally until the lease is spent or
// expires. A lease is at most a tenth of the key's rate or burst (and at
// most maxLease requests), starts at one request, doubles while leases are
// used up in time and halves when one expires unused, and lives at most
// leaseFor. What a lease holds is already counted in Redis, so the replicas
// together never let more through than the limit; an expired lease's
// leftover counts as spent (the key is then limited a little early, by at
// most one lease per replica). A refusal is always Redis's answer. Keys with
// small limits (rate or burst under 20) get leases of one: exactly one
// round trip per request, as without leases.
type Limiter struct {
	rl       *redis_rate.Limiter
	prefix   string
	defaults RateDefaults
	leaseFor time.Duration
	now      func() time.Time

	mu     sync.Mutex
	leases map[string]*lease // by bucket
}

// lease is a replica's local share of one bucket's budget.
type lease struct {
	mu        sync.Mutex
	size      int       // requests asked for at the next lease
	tokens    int       // requests left in the current lease
	expires   time.Time // end of the current lease
	remaining int       // Redis's remaining burst after the current lease was taken
	reset     time.Duration
}

const (
	// maxLease bounds the requests one lease holds.
	maxLease = 256
	// defaultLeaseFor bounds how long a lease may be used.
	defaultLeaseFor = 100 * time.Millisecond
	// maxBuckets bounds the leases kept; the map is emptied when full (a
	// flood of client addresses must not grow memory).
	maxBuckets = 10_000
)

// RateKeyPrefix is the prefix of the deployer's rate limit buckets. redis_rate
// puts "rate:" before every key, so they live under "rate:deployer:" in
// Redis, which the deployer's ACL user may use (deploy/redis/users.acl).
const RateKeyPrefix = "deployer:"

// NewLimiter returns a limiter allowing rate requests per second with
// bursts of burst, per key unless the key has its own rate (then its burst
// is twice its rate: see RateDefaults.For). Its Redis keys start with
// "rate:" and prefix.
func NewLimiter(rdb redis.UniversalClient, prefix string, rate, burst int) *Limiter {
	return &Limiter{rl: redis_rate.NewLimiter(rdb), prefix: prefix, defaults: RateDefaults{Rate: rate, Burst: burst},
		leaseFor: defaultLeaseFor, now: time.Now, leases: map[string]*lease{}}
}

// RateDefaults are the deployer's default rate limit (API_RATE_LIMIT,
// API_RATE_BURST), for keys without a rate of their own.
type RateDefaults struct {
	Rate  int // requests per second
	Burst int // requests a full budget holds
}

// For returns the rate and burst of a key whose own rate is own (0: the
// defaults): a key's own rate comes with a burst of twice it.
func (d RateDefaults) For(own int) (rate, burst int) {
	if own <= 0 {
		return d.Rate, d.Burst
	}
	return own, 2 * own
}

// Decision is the outcome of Allow. A bucket's budget holds Limit
// requests when full, and refills at Rate requests per second; Remaining
// counts against Limit.
type Decision struct {
	Allowed    bool
	Limit      int           // the burst: requests a full budget holds
	Rate       int           // requests per second the budget refills at
	Remaining  int           // requests left in the budget now, at most Limit (approximate while a lease is used)
	RetryAfter time.Duration // when not allowed: how long to wait
	ResetAfter time.Duration // until the budget is full again
}

// Allow takes one request from the budget of bucket (a key id, or
// "ip:<addr>" for failed authentications) at rate per second (0: the
// limiter's default).
func (l *Limiter) Allow(ctx context.Context, bucket string, rate int) (Decision, error) {
	rate, burst := l.defaults.For(rate)
	ls := l.lease(bucket)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	now := l.now()
	if ls.tokens > 0 && now.Before(ls.expires) {
		ls.tokens--
		return Decision{Allowed: true, Limit: burst, Rate: rate, Remaining: min(ls.remaining+ls.tokens, burst), ResetAfter: ls.reset}, nil
	}
	largest := max(1, min(maxLease, min(rate, burst)/10))
	switch {
	case ls.tokens > 0: // the last lease expired unused: ask for less
		ls.size /= 2
	case !ls.expires.IsZero() && now.Before(ls.expires): // used up in time: ask for more
		ls.size *= 2
	}
	ls.size = min(max(ls.size, 1), largest)
	ls.tokens = 0
	res, err := l.rl.AllowAtMost(ctx, l.prefix+bucket, rateLimit(rate, burst), ls.size)
	if err != nil {
		return Decision{}, fmt.Errorf("rate limit: %w", err)
	}
	d := Decision{Limit: burst, Rate: rate, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}
	if res.Allowed <= 0 {
		ls.expires = time.Time{}
		return d, nil
	}
	ls.tokens, ls.expires, ls.remaining, ls.reset = res.Allowed-1, now.Add(l.leaseFor), res.Remaining, res.ResetAfter
	d.Allowed, d.Remaining = true, min(res.Remaining+ls.tokens, burst)
	return d, nil
}

// lease returns bucket's lease, made when missing.
func (l *Limiter) lease(bucket string) *lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[bucket]
	if ls == nil {
		if len(l.leases) >= maxBuckets {
			clear(l.leases)
		}
		ls = &lease{size: 1}
		l.leases[bucket] = ls
	}
	return ls
}

func rateLimit(rate, burst int) redis_rate.Limit {
	return redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second}
}
