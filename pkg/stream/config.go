package stream

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Group is the consumer group (required). It is created on each stream
	// when missing.
	Group string
	// Streams are the streams to read (at least one), all in one read; on
	// Redis Cluster each has its own reader, so they may live in different
	// slots.
	Streams []string
	// Consumer is this consumer's name in the group. Default: host, pid and
	// a random suffix, unique per process. A stable name (for example a pod
	// name) makes the consumer re-read its own pending entries at start.
	Consumer string
	// Concurrency bounds the handlers running at once. Default 16.
	Concurrency int
	// Prefetch is how many entries the consumer may hold beyond Concurrency,
	// read ahead and waiting for a free handler: reads never ask for more
	// than Concurrency + Prefetch entries in all. A waiting entry is owned
	// and heartbeated like a running one (see the package documentation).
	// Default 0: a read asks only for free handler slots, which suits slow
	// handlers (a waiting entry is held while another consumer may be
	// idle); fast handlers drain much faster with a prefetch of 64 to 256.
	Prefetch int
	// Block is how long one read waits for new entries; it bounds how long
	// shutdown waits for readers. Default 1s.
	Block time.Duration
	// Lease is how long an entry may go without a heartbeat before another
	// consumer may claim it. Heartbeats run every Lease/4. Default 30s.
	Lease time.Duration
	// ClaimInterval is how often idle entries of other consumers are looked
	// for. Default min(Lease/4, 2s).
	ClaimInterval time.Duration
	// MaxDeliveries is the delivery limit: an entry that failed (or whose
	// consumer died) this many times is dead-lettered. Default 5.
	MaxDeliveries int64
	// RetryBackoff is the delay before a failed entry is redelivered; it
	// doubles with each delivery, up to Lease. Default 1s.
	RetryBackoff time.Duration
	// ShutdownGrace is how long in-flight handlers may run after the context
	// of Run is cancelled before they are cancelled. Default 30s.
	ShutdownGrace time.Duration
	// CancelGrace is how long cancelled handlers have to return before the
	// consumer gives up on them. Default 15s.
	CancelGrace time.Duration
	// StartID is where a newly created group starts reading: "0" (default,
	// everything still in the stream) or "$" (only new entries).
	StartID string
	// DeadLetterMaxLen is the approximate length kept of dead-letter
	// streams. Default 100,000.
	DeadLetterMaxLen int64
	// TrimInterval is how often the streams are trimmed to what their groups
	// still need (see TrimToGroups). Default 1m; negative disables.
	TrimInterval time.Duration
	// ConsumerIdleDelete removes other consumers of the group that have had
	// no pending entries and no activity for this long. Default 24h; negative
	// disables.
	ConsumerIdleDelete time.Duration
	// StatsInterval is how often group lag and pending are sampled into
	// Metrics. Default 10s.
	StatsInterval time.Duration
	// Logger receives the consumer's logs. The zero value logs nothing.
	Logger zerolog.Logger
	// Redact, when set, masks secrets in the text of handler errors and
	// panics before the consumer logs them or writes them to a
	// dead-letter entry (e.g. secrets.Redactor.RedactString): a handler's
	// error may quote what it resolved.
	Redact func(string) string
	// Metrics records the consumer's metrics; nil records nothing.
	Metrics *Metrics
	// Hook, when set, is called with every Event the consumer reports, from
	// the goroutine that caused it; it must return quickly. Tests use it to
	// wait for what happened instead of sleeping; production code leaves it
	// nil.
	Hook func(Event)
}

func (c *Config) setDefaults() {
	if c.Consumer == "" {
		c.Consumer = DefaultConsumerName()
	}
	c.Concurrency = cmp.Or(c.Concurrency, 16)
	c.Block = cmp.Or(c.Block, time.Second)
	c.Lease = cmp.Or(c.Lease, 30*time.Second)
	c.ClaimInterval = cmp.Or(c.ClaimInterval, min(c.Lease/4, 2*time.Second))
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, 5)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, time.Second)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 30*time.Second)
	c.CancelGrace = cmp.Or(c.CancelGrace, 15*time.Second)
	c.StartID = cmp.Or(c.StartID, "0")
	c.DeadLetterMaxLen = cmp.Or(c.DeadLetterMaxLen, 100_000)
	c.TrimInterval = cmp.Or(c.TrimInterval, time.Minute)
	c.ConsumerIdleDelete = cmp.Or(c.ConsumerIdleDelete, 24*time.Hour)
	c.StatsInterval = cmp.Or(c.StatsInterval, 10*time.Second)
}

// Validate reports every problem of a defaulted Config.
func (c *Config) Validate() error {
	var errs []error
	if c.Group == "" {
		errs = append(errs, errors.New("group is required"))
	}
	if len(c.Streams) == 0 {
		errs = append(errs, errors.New("at least one stream is required"))
	}
	seen := map[string]bool{}
	for _, s := range c.Streams {
		if s == "" {
			errs = append(errs, errors.New("empty stream name"))
		}
		if seen[s] {
			errs = append(errs, fmt.Errorf("stream %q listed twice", s))
		}
		if strings.HasSuffix(s, DeadLetterSuffix) {
			errs = append(errs, fmt.Errorf("stream %q is a dead-letter stream", s))
		}
		seen[s] = true
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency %d < 1", c.Concurrency))
	}
	if c.Prefetch < 0 {
		errs = append(errs, fmt.Errorf("prefetch %d < 0", c.Prefetch))
	}
	if c.Block < time.Millisecond {
		errs = append(errs, fmt.Errorf("block %v < 1ms", c.Block))
	}
	if c.Lease < 40*time.Millisecond {
		errs = append(errs, fmt.Errorf("lease %v < 40ms", c.Lease))
	}
	if c.ClaimInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("claim interval %v < 1ms", c.ClaimInterval))
	}
	if c.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("max deliveries %d < 1", c.MaxDeliveries))
	}
	if c.RetryBackoff < 0 || c.ShutdownGrace < 0 || c.CancelGrace < 0 {
		errs = append(errs, errors.New("negative durations are not allowed for retry backoff and graces"))
	}
	if c.StartID != "0" && c.StartID != "$" {
		if _, err := parseID(c.StartID); err != nil {
			errs = append(errs, fmt.Errorf("start id: %w", err))
		}
	}
	return errors.Join(errs...)
}

// DefaultConsumerName returns host-pid-random, unique per process.
func DefaultConsumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
