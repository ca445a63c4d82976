// Package tracing sets up OpenTelemetry traces for a service and carries a
// trace context across a stream inside a message (the traceparent and
// tracestate keys of the wire contract, messages.TraceContext).
//
// Tracing is on only when an OTLP endpoint is configured (the standard
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): spans
// are then batched and exported over OTLP/HTTP (protobuf). Otherwise New
// returns a no-op provider whose spans record nothing and cost next to
// nothing; a context a message carries is still handed on, so that a
// result carries its request's trace context whether or not the service
// traces.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Scope is the instrumentation scope of the project's spans.
const Scope = "github.com/autoprovisioner/autoprovisioner"

// Settings say where spans go. Both endpoints empty: tracing is off.
type Settings struct {
	// Endpoint is the OTLP base URL (OTEL_EXPORTER_OTLP_ENDPOINT), like
	// http://collector:4318; traces go to its path /v1/traces.
	Endpoint string
	// TracesEndpoint is the full URL of the OTLP traces endpoint
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), used as given; it wins over
	// Endpoint.
	TracesEndpoint string
	// ServiceName is the service.name of the spans (OTEL_SERVICE_NAME);
	// empty: the program's name.
	ServiceName string
	// Disabled turns tracing off whatever the endpoints (OTEL_SDK_DISABLED).
	Disabled bool
}

// Enabled reports whether spans are exported.
func (s Settings) Enabled() bool {
	return !s.Disabled && (s.Endpoint != "" || s.TracesEndpoint != "")
}

// URL returns the URL spans are sent to, "" when tracing is off.
func (s Settings) URL() string {
	switch {
	case !s.Enabled():
		return ""
	case s.TracesEndpoint != "":
		return s.TracesEndpoint
	default:
		return strings.TrimRight(s.Endpoint, "/") + "/v1/traces"
	}
}

// Provider is a service's tracer provider and its shutdown.
type Provider struct {
	trace.TracerProvider
	shutdown func(context.Context) error
}

// Noop returns a provider that records nothing.
func Noop() *Provider {
	return &Provider{TracerProvider: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
}

// New returns the provider s asks for: an OTLP/HTTP exporter behind a batch
// processor when tracing is enabled, else Noop. name is the service.name
// when s has none. The exporter reads the other standard variables
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE), the
// SDK the sampler (OTEL_TRACES_SAMPLER, default: parent-based, always on)
// and batching (OTEL_BSP_*), from the process environment.
func New(ctx context.Context, s Settings, name string) (*Provider, error) {
	if !s.Enabled() {
		return Noop(), nil
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(s.URL()))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	if s.ServiceName != "" {
		name = s.ServiceName
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithProcessPID(),
		resource.WithAttributes(attribute.String("service.name", name)))
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{TracerProvider: tp, shutdown: tp.Shutdown}, nil
}

// Shutdown exports the spans still buffered and stops the provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// Tracer returns the project's tracer of tp; nil tp: a no-op tracer.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(Scope)
}

// w3c is the W3C Trace Context propagator.
var w3c = propagation.TraceContext{}

// Inject returns the trace context of ctx's span for a message; empty when
// ctx has no valid span context.
func Inject(ctx context.Context) messages.TraceContext {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return messages.TraceContext{}
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return messages.TraceContext{Traceparent: c.Get("traceparent"), Tracestate: c.Get("tracestate")}
}

// Extract returns ctx with the remote span context tc carries as its
// parent; ctx itself when tc is empty or not a usable context (an all-zero
// trace or span id).
func Extract(ctx context.Context, tc messages.TraceContext) context.Context {
	if tc.Traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{"traceparent": tc.Traceparent, "tracestate": tc.Tracestate})
}

// StartPublish starts the producer span of a message about to be added to
// stream, and returns the context to Inject into the message. End the span
// after the XADD (End records err).
func StartPublish(ctx context.Context, tp trace.TracerProvider, stream string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append([]attribute.KeyValue{
		attribute.String("messaging.system", "redis"),
		attribute.String("messaging.destination.name", stream),
		attribute.String("messaging.operation.type", "send"),
	}, attrs...)
	return Tracer(tp).Start(ctx, "send "+stream, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
}

// End ends span, recording err (when not nil) as its error status.
func End(span trace.Span, err error, opts ...trace.SpanEndOption) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(opts...)
}

// EndAt ends span at t (see End).
func EndAt(span trace.Span, err error, t time.Time) { End(span, err, trace.WithTimestamp(t)) }
