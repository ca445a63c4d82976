// Package outbox runs the store-then-publish loop the services share: a
// message is stored in Postgres first (with the state change it belongs
// to), published to Redis, then marked published; what was stored and not
// marked (Redis was down, the process died between the steps) is found
// again and published again, which the job id makes harmless.
//
// Each side owns its rows and implements one pass, a Relayer: load the
// rows due (never published; for the deployer, also older than a delay),
// publish them, mark them. The scheduler's relay does it in one
// transaction that claims its rows with FOR UPDATE SKIP LOCKED
// (fleet.Relay); the deployer's republisher publishes deployments its
// submit path failed to publish. The loop around the pass is this
// package's: passes of at most Batch rows until one comes back short,
// then a wait for a wake-up or the next tick, and one error log per
// failing streak.
//
// Model: watermill's components/forwarder.
package outbox

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// Relayer publishes one batch: it loads up to limit rows due, publishes
// them and marks them published, and returns how many it published. Rows
// it published must be marked (or the marks be on their way) before it
// returns, so that the next pass does not load them again.
type Relayer interface {
	RelayBatch(ctx context.Context, limit int) (int, error)
}

// RelayFunc is a function that is a Relayer.
type RelayFunc func(ctx context.Context, limit int) (int, error)

// RelayBatch calls f.
func (f RelayFunc) RelayBatch(ctx context.Context, limit int) (int, error) { return f(ctx, limit) }

// Config configures Drain and Run. Zero values take the defaults.
type Config struct {
	// Batch is the most rows a pass loads (default 500).
	Batch int
	// Interval is how often Run looks when nothing wakes it (default 1s).
	Interval time.Duration
	// Wake, when not nil, makes Run look at once.
	Wake <-chan struct{}
	// Published, when not nil, is told how many rows each pass published.
	Published func(n int)
	// AfterDrain, when not nil, runs after each drain (metrics, pruning).
	AfterDrain func(ctx context.Context)
	// Name names the loop in its logs ("relay": "relay failed: ...");
	// default "outbox".
	Name string
	// Logger logs a failing streak once, and its end.
	Logger zerolog.Logger
}

func (c *Config) defaults() {
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Name == "" {
		c.Name = "outbox"
	}
}

// Drain runs passes of r until one publishes fewer than cfg.Batch rows,
// and returns how many rows they published.
func Drain(ctx context.Context, r Relayer, cfg Config) (int, error) {
	cfg.defaults()
	total := 0
	for {
		n, err := r.RelayBatch(ctx, cfg.Batch)
		total += n
		if cfg.Published != nil {
			cfg.Published(n)
		}
		if err != nil {
			return total, err
		}
		if n < cfg.Batch {
			return total, nil
		}
	}
}

// Run drains r at once, then whenever cfg.Wake fires or cfg.Interval
// passes, until ctx is done. A failed drain is retried on the next round:
// the rows stay stored.
func Run(ctx context.Context, r Relayer, cfg Config) error {
	cfg.defaults()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	failing := false
	for {
		n, err := Drain(ctx, r, cfg)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				cfg.Logger.Error().Err(err).Msg(cfg.Name + " failed: the messages stay stored, retrying")
			}
			failing = true
		case err == nil:
			if failing {
				cfg.Logger.Info().Msg(cfg.Name + " recovered")
			}
			failing = false
			if n > 0 {
				cfg.Logger.Debug().Int("published", n).Msg(cfg.Name + ": stored messages published")
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if cfg.AfterDrain != nil {
			cfg.AfterDrain(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-cfg.Wake:
		case <-t.C:
		}
	}
}
