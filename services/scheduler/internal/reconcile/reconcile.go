// Package reconcile is the scheduler's loop (seed 000's daemon): every tick
// it syncs the sources, then queues a ProvisionerMessage for each server
// that needs one, at most one in flight per server, in priority order (new
// servers, retries of FAILED ones after their backoff, UNREACHABLE ones
// after the cool-down, recoveries, rebuilds), and mends jobs that never
// reported back. Queued messages wait in the outbox until the Relay
// publishes them to Redis.
package reconcile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

// Actor is the name the loop writes into history.
const Actor = "scheduler"

// Syncer merges the sources into the fleet (detect.Manager).
type Syncer interface {
	Sync(ctx context.Context) (detect.Report, error)
}

// ResultApplier applies an encoded ProvisionerResult (the results
// consumer), for jobs whose published result was lost.
type ResultApplier interface {
	ApplyEncoded(ctx context.Context, data []byte) error
}

// Config configures a Loop. Zero values take the defaults.
type Config struct {
	// Interval between ticks (default 30s).
	Interval time.Duration
	// Batch is the most jobs queued per tick (default 500).
	Batch int
	// StuckAfter is how long a job may go without a result and without
	// infra working on it before it is handed over again (default 2h; keep
	// it above infra's PLAYBOOK_TIMEOUT).
	StuckAfter time.Duration
	// Leader elects the replica that ticks; nil ticks on every replica.
	Leader *Leader
	Logger zerolog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Wake, when not nil, is signalled after a tick queued jobs (the relay).
	Wake chan<- struct{}
}

// Loop is the reconcile loop.
type Loop struct {
	fleet   *fleet.Store
	sync    Syncer
	rules   func() *rules.Set
	results ResultApplier
	cfg     Config
	log     zerolog.Logger
	m       *loopMetrics
	kick    chan struct{}
}

// New returns a Loop. sync and results may be nil (no sources; stuck jobs
// with a stored result are then requeued instead).
func New(f *fleet.Store, sync Syncer, rulesFn func() *rules.Set, results ResultApplier, cfg Config) *Loop {
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = 2 * time.Hour
	}
	if rulesFn == nil {
		rulesFn = func() *rules.Set { return nil }
	}
	return &Loop{fleet: f, sync: sync, rules: rulesFn, results: results, cfg: cfg,
		log: cfg.Logger.With().Str("component", "reconcile").Logger(), m: newLoopMetrics(cfg.Registerer),
		kick: make(chan struct{}, 1)}
}

// Kick asks for a tick now (an operator's request, a new server).
func (l *Loop) Kick() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run ticks every Interval until ctx is done. A failing tick is logged and
// the next one tried; the loop never exits on its own.
func (l *Loop) Run(ctx context.Context) error {
	defer func() {
		if l.cfg.Leader != nil {
			l.cfg.Leader.Release()
		}
	}()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		lead := true
		if l.cfg.Leader != nil {
			var err error
			if lead, err = l.cfg.Leader.Check(ctx); err != nil && ctx.Err() == nil {
				l.log.Warn().Err(err).Msg("leader election failed: not ticking")
			}
		}
		l.m.leader.Set(b2f(lead))
		if lead {
			if _, err := l.Tick(ctx); err != nil && ctx.Err() == nil {
				l.log.Error().Err(err).Msg("tick failed")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.kick:
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TickReport says what one tick did.
type TickReport struct {
	Detect   detect.Report
	Due      int
	Queued   int
	Requeued int
	Mended   int // stuck jobs whose stored result was applied
	// Durations of the tick's phases.
	SyncTook, DueTook, QueueTook, StuckTook, Took time.Duration
}

// Tick runs one pass: sources, queueing, stuck jobs.
func (l *Loop) Tick(ctx context.Context) (r TickReport, err error) {
	start := time.Now()
	defer func() {
		r.Took = time.Since(start)
		l.m.tick.Observe(r.Took.Seconds())
	}()
	if l.sync != nil {
		t := time.Now()
		rep, err := l.sync.Sync(ctx)
		r.Detect, r.SyncTook = rep, time.Since(t)
		if err != nil {
			return r, fmt.Errorf("sync sources: %w", err)
		}
	}
	t := time.Now()
	var due []fleet.Candidate
	due, err = l.fleet.Due(ctx, l.cfg.Batch)
	r.DueTook = time.Since(t)
	if err != nil {
		return r, err
	}
	r.Due = len(due)
	if len(due) > 0 {
		t = time.Now()
		jobs, err := l.jobs(due)
		if err != nil {
			return r, err
		}
		queued, err := l.fleet.Queue(ctx, jobs, Actor)
		r.QueueTook = time.Since(t)
		if err != nil {
			return r, err
		}
		r.Queued = len(queued)
		for _, j := range jobs {
			l.m.queued.WithLabelValues(string(j.Action)).Inc()
		}
		if r.Queued > 0 {
			l.log.Info().Int("queued", r.Queued).Int("due", r.Due).Msg("jobs queued")
			if l.cfg.Wake != nil {
				select {
				case l.cfg.Wake <- struct{}{}:
				default:
				}
			}
		}
	}
	t = time.Now()
	if err := l.mendStuck(ctx, &r); err != nil {
		return r, err
	}
	r.StuckTook = time.Since(t)
	return r, nil
}

// jobs builds the messages of the due servers.
func (l *Loop) jobs(due []fleet.Candidate) ([]fleet.Job, error) {
	set := l.rules()
	now := messages.FormatTime(time.Now())
	jobs := make([]fleet.Job, 0, len(due))
	for _, c := range due {
		plan := set.Plan(c.Labels)
		msg := &messages.ProvisionerMessage{
			RequestMeta:    messages.RequestMeta{JobID: NewJobID(c.Handle), CreatedAt: now},
			ServerHandle:   c.Handle,
			ForceReinstall: c.Action == fleet.ActionRebuild,
			IsRecovery:     c.Action == fleet.ActionRecovery,
			// The rules' playbooks run after the base playbook of every
			// action: a recovery puts back what they set up, too.
			Playbooks: plan.Playbooks,
		}
		data, err := messages.Encode(msg)
		if err != nil {
			return nil, fmt.Errorf("encode message for %s: %w", c.Handle, err)
		}
		reason := reasonFor(c)
		if len(plan.Rules) > 0 {
			reason += "; rules: " + strings.Join(plan.Rules, ", ")
		}
		jobs = append(jobs, fleet.Job{Handle: c.Handle, Version: c.Version, Action: c.Action, JobID: msg.JobID,
			Payload: data, Reason: reason})
	}
	return jobs, nil
}

func reasonFor(c fleet.Candidate) string {
	switch {
	case c.RequestedBy != "":
		return "requested by " + c.RequestedBy
	case c.Status == fleet.StatusNew:
		return "new server"
	case c.Status == fleet.StatusFailed:
		return fmt.Sprintf("retry after %d failed attempts", c.Attempts)
	case c.Status == fleet.StatusUnreachable:
		return "re-check after the cool-down"
	}
	return "due"
}

// NewJobID returns a fresh job id for a job of handle.
func NewJobID(handle string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sched-" + handle + "-" + hex.EncodeToString(b[:])
}

// mendStuck finds jobs that never reported back: a run infra finished has
// its stored result applied (the published one was lost); a job infra never
// started is handed over again with the same job id.
func (l *Loop) mendStuck(ctx context.Context, r *TickReport) error {
	stuck, err := l.fleet.Stuck(ctx, l.cfg.StuckAfter, l.cfg.Batch)
	if err != nil {
		return err
	}
	for _, j := range stuck {
		log := l.log.With().Str("server", j.Handle).Str("job_id", j.JobID).Logger()
		if j.RunState == "done" && len(j.Result) > 0 && l.results != nil {
			if err := l.results.ApplyEncoded(ctx, j.Result); err != nil {
				log.Error().Err(err).Msg("applying the stored result of a stuck job failed")
				continue
			}
			log.Warn().Msg("job finished but its result never arrived: applied the stored result")
			r.Mended++
			continue
		}
		ok, err := l.fleet.Requeue(ctx, j.Handle, j.JobID, Actor,
			fmt.Sprintf("no result after %s and infra is not running it: handed over again", l.cfg.StuckAfter))
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			log.Error().Err(err).Msg("requeue of a stuck job failed")
			continue
		}
		if ok {
			log.Warn().Msg("job never reported back: handed over again with the same job id")
			r.Requeued++
		}
	}
	return nil
}

type loopMetrics struct {
	tick   prometheus.Histogram
	queued *prometheus.CounterVec
	leader prometheus.Gauge
}

func newLoopMetrics(reg prometheus.Registerer) *loopMetrics {
	m := &loopMetrics{
		tick: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "autoprov_scheduler_tick_duration_seconds", Help: "Duration of a reconcile tick (sources included).",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 10),
		}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_jobs_queued_total", Help: "Jobs the loop tried to queue, by action.",
		}, []string{"action"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_leader", Help: "1 while this replica runs the ticks.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.tick, m.queued, m.leader)
	}
	return m
}
