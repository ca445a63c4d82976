// Package schedules runs the job template schedules on the scheduler: the
// leader turns due schedules into occurrences (pkg/schedule.Materialize)
// every Interval; the deployer launches them.
package schedules

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
)

// Config configures the Loop.
type Config struct {
	// Interval is the time between two rounds. Default 1s.
	Interval time.Duration
	// Batch is how many schedules one transaction moves on. Default 500.
	Batch int
	// Active reports whether this replica leads; nil: always. Safety does
	// not depend on it (see schedule.Materialize).
	Active     func() bool
	Logger     zerolog.Logger
	Registerer prometheus.Registerer
}

// Loop materializes due schedules.
type Loop struct {
	db       schedule.Beginner
	cfg      Config
	log      zerolog.Logger
	written  prometheus.Counter
	failures prometheus.Counter
	now      func() time.Time
}

// New returns a Loop over db.
func New(db schedule.Beginner, cfg Config) (*Loop, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	l := &Loop{db: db, cfg: cfg, log: cfg.Logger.With().Str("component", "schedules").Logger(), now: time.Now,
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "autoprov_scheduler_schedule_occurrences_total",
			Help: "Occurrences of job template schedules written for the deployer to launch."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "autoprov_scheduler_schedule_round_failures_total",
			Help: "Rounds of the schedules loop that failed (retried next round)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{l.written, l.failures} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// Run materializes due schedules every Interval until ctx is done.
func (l *Loop) Run(ctx context.Context) error {
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		if l.cfg.Active == nil || l.cfg.Active() {
			l.round(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (l *Loop) round(ctx context.Context) {
	n, err := schedule.Materialize(ctx, l.db, l.now(), l.cfg.Batch)
	l.written.Add(float64(n))
	switch {
	case err != nil && ctx.Err() == nil:
		l.failures.Inc()
		l.log.Warn().Err(err).Msg("schedules round failed; retried next round")
	case n > 0:
		l.log.Info().Int("occurrences", n).Msg("schedule occurrences due")
	}
}
