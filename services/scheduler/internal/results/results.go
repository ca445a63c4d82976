// Package results consumes provisioner:results in the consumer group
// "scheduler" and completes each result through fleet.ApplyResult: infra
// already moved the server to READY, FAILED or UNREACHABLE when it stored
// the run (fleet.RecordRun), so the scheduler clears the wait, applies the
// retry budget and backoff per the server's rules and queues the
// notification; it makes the transition itself only for a result infra
// published without a run. Deduplicated by job id (a redelivered result
// changes nothing); a result of a job the server no longer waits for is
// recorded in history and ignored.
package results

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

// Group is the consumer group of the scheduler on provisioner:results.
const Group = "scheduler"

// Actor is the name the handler writes into history.
const Actor = "results"

// Policy is the default retry policy; rules may change the limit per server.
type Policy struct {
	// RetryLimit is how many failed attempts a server may have (default 3).
	RetryLimit int
	// Backoff is the wait after the first failure; it doubles with each
	// further failure up to MaxBackoff (defaults 1m and 1h).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// UnreachableCooldown is the wait before an UNREACHABLE server is
	// checked again (default 10m).
	UnreachableCooldown time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.RetryLimit <= 0 {
		p.RetryLimit = 3
	}
	if p.Backoff <= 0 {
		p.Backoff = time.Minute
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = time.Hour
	}
	if p.UnreachableCooldown <= 0 {
		p.UnreachableCooldown = 10 * time.Minute
	}
	return p
}

// BackoffFor returns the wait after the attempts-th failure: Backoff *
// 2^(attempts-1), at most MaxBackoff.
func (p Policy) BackoffFor(attempts int) time.Duration {
	p = p.withDefaults()
	d := p.Backoff
	for i := 1; i < attempts && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// Handler applies results.
type Handler struct {
	fleet  *fleet.Store
	rules  func() *rules.Set
	policy Policy
	log    zerolog.Logger
	count  *prometheus.CounterVec
	// Applied, when not nil, is called after each applied result (the
	// notifier's wake-up).
	Applied func()
	// Tracing, when not nil, makes a consumer span per result applied,
	// continuing the trace the result carries (infra's job span).
	Tracing trace.TracerProvider
}

// New returns a Handler; reg may be nil.
func New(f *fleet.Store, rulesFn func() *rules.Set, policy Policy, log zerolog.Logger, reg prometheus.Registerer) *Handler {
	if rulesFn == nil {
		rulesFn = func() *rules.Set { return nil }
	}
	h := &Handler{fleet: f, rules: rulesFn, policy: policy.withDefaults(), log: log.With().Str("component", "results").Logger(),
		count: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_results_total", Help: "Results read, by outcome (applied, duplicate, stale, unknown_server) and status.",
		}, []string{"outcome", "status"})}
	if reg != nil {
		reg.MustRegister(h.count)
	}
	return h
}

var _ stream.Handler = (*Handler)(nil)

// Handle applies one result entry. An entry that is not a valid result is
// dead-lettered; a Postgres failure is retried by redelivery.
func (h *Handler) Handle(ctx context.Context, msg *stream.Message) error {
	res, err := messages.DecodeProvisionerResult(msg.Data())
	if err != nil {
		h.log.Warn().Err(err).Str("msg_id", msg.ID).Msg("invalid result dead-lettered")
		return stream.Permanent("invalid_result", err)
	}
	if h.Tracing == nil {
		return h.apply(ctx, res)
	}
	ctx, span := tracing.Tracer(h.Tracing).Start(tracing.Extract(ctx, res.TraceContext), SpanApply,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			attribute.String("messaging.system", "redis"),
			attribute.String("messaging.destination.name", messages.StreamProvisionerResults),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.message.id", msg.ID),
			attribute.String("autoprov.job_id", res.JobID),
			attribute.String("autoprov.server", res.ServerHandle),
			attribute.String("autoprov.status", string(res.Status)),
		))
	err = h.apply(ctx, res)
	tracing.End(span, err)
	return err
}

// SpanApply is the name of the span of a result applied.
const SpanApply = "process " + messages.StreamProvisionerResults

// ApplyEncoded applies an encoded result (a stored one, for a job whose
// published result was lost).
func (h *Handler) ApplyEncoded(ctx context.Context, data []byte) error {
	res, err := messages.DecodeProvisionerResult(data)
	if err != nil {
		return fmt.Errorf("decode stored result: %w", err)
	}
	return h.apply(ctx, res)
}

func (h *Handler) apply(ctx context.Context, res *messages.ProvisionerResult) error {
	log := h.log.With().Str("job_id", res.JobID).Str("server", res.ServerHandle).Str("status", string(res.Status)).Logger()
	if res.ServerHandle == "" {
		h.count.WithLabelValues("unknown_server", string(res.Status)).Inc()
		log.Warn().Msg("result without a server handle ignored")
		return nil
	}
	srv, err := h.fleet.Get(ctx, res.ServerHandle)
	if errors.Is(err, fleet.ErrNotFound) {
		h.count.WithLabelValues("unknown_server", string(res.Status)).Inc()
		log.Warn().Msg("result for an unknown server ignored")
		return nil
	}
	if err != nil {
		return err
	}
	plan := h.rules().Plan(srv.Labels)
	limit := h.policy.RetryLimit
	if plan.Settings.RetryLimit > 0 {
		limit = plan.Settings.RetryLimit
	}
	r := fleet.ResultOf(res)
	outcome, after, err := h.fleet.ApplyResult(ctx, r, Actor, fleet.RetryPolicy{
		Limit: limit, Backoff: h.policy.BackoffFor, UnreachableCooldown: h.policy.UnreachableCooldown,
	})
	if errors.Is(err, fleet.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	h.count.WithLabelValues(string(outcome), string(res.Status)).Inc()
	ev := log.Info()
	if outcome != fleet.Applied {
		ev = log.Warn()
	}
	ev.Str("outcome", string(outcome)).Str("server_status", after.Status).Int("attempts", after.Attempts).
		Bool("retries_exhausted", after.RetriesExhausted).Time("next_attempt_at", after.NextAttemptAt).Msg("result read")
	if outcome == fleet.Applied && h.Applied != nil {
		h.Applied()
	}
	return nil
}
