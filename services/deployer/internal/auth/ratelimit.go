package auth

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Limiter limits requests per API key with the generic cell rate algorithm
// of redis_rate, whose state lives in Redis: every replica shares each
// key's budget.
type Limiter struct {
	rl     *redis_rate.Limiter
	prefix string
	rate   int
	burst  int
}

// NewLimiter returns a limiter allowing rate requests per second with
// bursts of burst, per key unless the key has its own rate (then its burst
// is twice its rate). Its Redis keys start with prefix.
func NewLimiter(rdb redis.UniversalClient, prefix string, rate, burst int) *Limiter {
	return &Limiter{rl: redis_rate.NewLimiter(rdb), prefix: prefix, rate: rate, burst: burst}
}

// Decision is the outcome of Allow.
type Decision struct {
	Allowed    bool
	Limit      int           // requests per second
	Remaining  int           // requests left in the burst now
	RetryAfter time.Duration // when not allowed: how long to wait
	ResetAfter time.Duration // until the burst is full again
}

// Allow takes one request from the budget of bucket (a key id, or
// "ip:<addr>" for failed authentications) at rate per second (0: the
// limiter's default).
func (l *Limiter) Allow(ctx context.Context, bucket string, rate int) (Decision, error) {
	burst := l.burst
	if rate <= 0 {
		rate = l.rate
	} else {
		burst = 2 * rate
	}
	res, err := l.rl.Allow(ctx, l.prefix+bucket, redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second})
	if err != nil {
		return Decision{}, fmt.Errorf("rate limit: %w", err)
	}
	return Decision{
		Allowed: res.Allowed > 0, Limit: rate, Remaining: res.Remaining,
		RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter,
	}, nil
}
