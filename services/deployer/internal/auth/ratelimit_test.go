package auth

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// Two replicas hammering one key together never let more through than the
// shared budget, and leases waste at most one lease per replica.
func TestLimiterLeasesNeverExceedTheSharedBudget(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Unique("rate-") + ":"
	const rate, burst = 100, 200
	replicas := []*Limiter{NewLimiter(rdb, prefix, rate, burst), NewLimiter(rdb, prefix, rate, burst)}
	for _, l := range replicas {
		l.leaseFor = time.Hour // no lease expires during the test: no waste but the last leases
	}
	var allowed, calls atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for range 250 {
				d, err := replicas[w%2].Allow(context.Background(), "key:k", 0)
				if err != nil {
					t.Error(err)
					return
				}
				calls.Add(1)
				if d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// GCRA: the burst, plus what refills while the test runs.
	most := burst + int64(float64(rate)*elapsed.Seconds()) + 1
	// Each replica's last lease may hold up to a tenth of the rate unused.
	least := int64(burst - 2*rate/10)
	if n := allowed.Load(); n > most || n < least {
		t.Fatalf("%d of %d requests allowed in %s; want between %d and %d", n, calls.Load(), elapsed, least, most)
	}
}

// Small limits are exact: one Redis decision per request.
func TestLimiterSmallLimitIsExact(t *testing.T) {
	rdb := testenv.Redis(t)
	l := NewLimiter(rdb, testenv.Unique("rate-")+":", 1, 3)
	for i := range 3 {
		d, err := l.Allow(context.Background(), "key:k", 0)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d of the burst of 3: %+v, %v", i+1, d, err)
		}
	}
	d, err := l.Allow(context.Background(), "key:k", 0)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || d.Limit != 3 || d.Rate != 1 {
		t.Fatalf("4th request at 1/s with a burst of 3: %+v, %v", d, err)
	}
	// A key's own rate is its limit, with a burst of twice it.
	d, err = l.Allow(context.Background(), "key:other", 5)
	if err != nil || !d.Allowed || d.Limit != 10 || d.Rate != 5 || d.Remaining != 9 {
		t.Fatalf("a key with its own rate: %+v, %v", d, err)
	}
}

// A lease is used only until it expires: after that the replica asks Redis
// again, and a budget spent meanwhile by another replica is refused.
func TestLimiterExpiredLeaseIsNotUsed(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Unique("rate-") + ":"
	const rate, burst = 1000, 1000
	clock := time.Now()
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	a := NewLimiter(rdb, prefix, rate, burst)
	a.now = now
	// Grow a's lease: sizes 1, 2, 4, 8, 16, ...
	for range 1 + 2 + 4 + 8 + 1 {
		if d, err := a.Allow(context.Background(), "key:k", 0); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	ls := a.lease("key:k")
	if ls.tokens != 15 || ls.size != 16 {
		t.Fatalf("lease after 16 requests used in time: %d tokens, size %d; want 15 and 16", ls.tokens, ls.size)
	}
	// Another replica spends the rest of the budget.
	b := NewLimiter(rdb, prefix, rate, burst)
	res, err := b.rl.AllowAtMost(context.Background(), prefix+"key:k", rateLimit(rate, burst), 10*burst)
	if err != nil || res.Allowed == 0 {
		t.Fatalf("spending the budget: %+v, %v", res, err)
	}
	// Within the lease, a keeps serving from it without asking Redis.
	if d, err := a.Allow(context.Background(), "key:k", 0); err != nil || !d.Allowed {
		t.Fatalf("within the lease: %+v, %v", d, err)
	}
	// Once it expires, its 14 leftover requests are not used: Redis decides
	// (it refuses, unless the budget refilled meanwhile: then a new lease).
	advance(a.leaseFor + time.Millisecond)
	d, err := a.Allow(context.Background(), "key:k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed && !ls.expires.Equal(now().Add(a.leaseFor)) {
		t.Fatalf("allowed after the lease expired, but not from a new lease: %+v", d)
	}
	if ls.size != 8 {
		t.Errorf("a lease that expired unused did not shrink: size %d, want 8", ls.size)
	}
}

// The limiter works as the deployer's ACL user of the shipped ACL file: a
// refused command would let every request through (the API fails open
// when the limiter errs), so the limit would silently not hold.
func TestLimiterUnderTheShippedACL(t *testing.T) {
	_, rc := testenv.ACLRedis(t)
	for _, rate := range []int{1, 100} { // exact, and with leases
		l := NewLimiter(rc["deployer"], RateKeyPrefix, rate, rate*2)
		allowed := 0
		for range rate*2 + 1 {
			d, err := l.Allow(context.Background(), "key:ci", 0)
			if err != nil {
				t.Fatalf("rate %d: the deployer's ACL user cannot use the limiter: %v", rate, err)
			}
			if d.Allowed {
				allowed++
			}
		}
		if allowed < rate*2-rate/10 || allowed > rate*2+1 {
			t.Errorf("rate %d, burst %d: %d of %d allowed", rate, rate*2, allowed, rate*2+1)
		}
		if err := rc["admin"].Del(context.Background(), "rate:"+RateKeyPrefix+"key:ci").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// What the limiter writes is where the ACL allows it, and nowhere else.
	keys, err := rc["admin"].Keys(context.Background(), "*").Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("keys left: %v %v", keys, err)
	}
}
