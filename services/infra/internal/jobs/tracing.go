package jobs

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// Span names of a job: one job span, a child of the producer's context
// the request carries, with a child span per step.
const (
	spanJob     = "infra job"
	spanDecode  = "decode"
	spanLock    = "lock"
	spanSSH     = "ssh check"
	spanSecret  = "resolve secret"
	spanPlay    = "play"
	spanPublish = "publish result"
)

// traceOf returns the trace context a decoded request carries (none when
// it could not be decoded).
func traceOf(tc *messages.TraceContext) messages.TraceContext {
	if tc == nil {
		return messages.TraceContext{}
	}
	return *tc
}

// startTrace starts the job span as a child of the request's trace context
// (a new trace when it has none) at began, when the entry was read, with
// its decode span from began to now, and puts the job's context in the
// result. It returns the context the job runs in. decodeErr marks the
// decode span failed.
func (j *job) startTrace(ctx context.Context, tc messages.TraceContext, began time.Time, decodeErr error) context.Context {
	tracer := tracing.Tracer(j.h.Tracing)
	ctx, j.span = tracer.Start(tracing.Extract(ctx, tc), spanJob, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(began), trace.WithAttributes(
			attribute.String("messaging.system", "redis"),
			attribute.String("messaging.destination.name", j.msg.Stream),
			attribute.String("messaging.message.id", j.msg.ID),
			attribute.String("autoprov.job_id", j.id),
			attribute.String("autoprov.job_kind", j.kind),
			attribute.Int64("autoprov.delivery", j.msg.Deliveries),
		))
	_, decode := tracer.Start(ctx, spanDecode, trace.WithTimestamp(began))
	endSpan(decode, decodeErr)
	j.out.TraceContext = tracing.Inject(ctx)
	ctx, j.pgTrips = store.CountRoundTrips(ctx) // on the "job finished" line
	return ctx
}

// endTrace ends the job span with the job's status.
func (j *job) endTrace() {
	if j.span == nil {
		return
	}
	if j.out.Status != "" {
		j.span.SetAttributes(attribute.String("autoprov.status", string(j.out.Status)))
	}
	if j.out.Error != nil {
		j.span.SetStatus(codes.Error, string(j.out.Error.Kind))
	}
	j.span.End()
}

// startSpan starts a step of the job.
func (j *job) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tracing.Tracer(j.h.Tracing).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends a step, failed when err is not nil. The status names the
// error kind only: error texts may hold what a span must not carry.
func endSpan(span trace.Span, err error) {
	if err != nil {
		desc := "error"
		if o, ok := asOutcome(err); ok {
			desc = string(o.kind)
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}
