package tracing_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing/otlptest"
)

func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    tracing.Settings
		url  string
	}{
		{"off", tracing.Settings{}, ""},
		{"base endpoint", tracing.Settings{Endpoint: "http://c:4318/"}, "http://c:4318/v1/traces"},
		{"traces endpoint as given", tracing.Settings{Endpoint: "http://a:4318", TracesEndpoint: "https://c/otlp/traces"}, "https://c/otlp/traces"},
		{"disabled", tracing.Settings{Endpoint: "http://c:4318", Disabled: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.URL(); got != tc.url {
				t.Errorf("URL() = %q, want %q", got, tc.url)
			}
			if got := tc.s.Enabled(); got != (tc.url != "") {
				t.Errorf("Enabled() = %v", got)
			}
		})
	}
}

// TestOffIsNoop: without an endpoint the provider records nothing, yet a
// context a message carries is handed on unchanged.
func TestOffIsNoop(t *testing.T) {
	p, err := tracing.New(t.Context(), tracing.Settings{}, "x")
	if err != nil {
		t.Fatal(err)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := tracing.Extract(t.Context(), messages.TraceContext{Traceparent: tp, Tracestate: "k=v"})
	ctx, span := tracing.Tracer(p).Start(ctx, "job")
	if span.IsRecording() {
		t.Error("no-op span records")
	}
	span.End()
	if got := tracing.Inject(ctx); got.Traceparent != tp || got.Tracestate != "k=v" {
		t.Errorf("Inject = %+v, want the carried context", got)
	}
	if got := tracing.Inject(t.Context()); got.Traced() {
		t.Errorf("Inject without a span = %+v, want empty", got)
	}
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestExportAcrossAMessage: a producer span injected into a message and
// extracted on the other side gives one trace, exported over OTLP/HTTP to
// a local receiver.
func TestExportAcrossAMessage(t *testing.T) {
	rcv := otlptest.Start()
	defer rcv.Close()
	p, err := tracing.New(t.Context(), tracing.Settings{Endpoint: rcv.Endpoint(), ServiceName: "producer"}, "x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, send := tracing.StartPublish(t.Context(), p, "provisioner:queue")
	msg := messages.ProvisionerMessage{ServerHandle: "web-1"}
	msg.TraceContext = tracing.Inject(ctx)
	send.End()
	if !msg.Traced() {
		t.Fatal("no trace context injected")
	}
	data, err := messages.Encode(&msg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := messages.DecodeProvisionerMessage(data)
	if err != nil {
		t.Fatal(err)
	}
	cctx, job := tracing.Tracer(p).Start(tracing.Extract(context.Background(), got.TraceContext), "job")
	job.End()
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	spans, ok := rcv.WaitFor(wctx, func(s []otlptest.Span) bool { return len(s) >= 2 })
	if !ok {
		t.Fatalf("spans received: %+v", spans)
	}
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	sendSpan, jobSpan := byName["send provisioner:queue"], byName["job"]
	if sendSpan.Kind != 4 { // SPAN_KIND_PRODUCER
		t.Errorf("send span kind %v", sendSpan.Kind)
	}
	if sendSpan.Service != "producer" || sendSpan.Attrs["messaging.destination.name"] != "provisioner:queue" {
		t.Errorf("send span %+v", sendSpan)
	}
	if jobSpan.TraceID != sendSpan.TraceID || jobSpan.ParentID != sendSpan.SpanID {
		t.Errorf("job span %+v is not a child of the send span %+v", jobSpan, sendSpan)
	}
	if sc := trace.SpanContextFromContext(cctx); sc.TraceID().String() != sendSpan.TraceID {
		t.Errorf("consumer trace id %s", sc.TraceID())
	}
}
