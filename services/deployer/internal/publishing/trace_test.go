package publishing

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// TestSubmitCarriesTraceContext: a submitted deployment is published in a
// producer span, a child of the caller's trace context, and the request on
// the queue carries the span's context.
func TestSubmitCarriesTraceContext(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	s, _, rdb, streams := newTestServiceWith(t, deployments.Config{Tracing: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := tracing.Extract(context.Background(), messages.TraceContext{Traceparent: parent})
	sub, err := s.Submit(ctx, "", deployments.AllProjects, deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop",
		ServerIP: "198.51.100.7", Port: 22}, "")
	if err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, streams.Queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %v, %v", entries, err)
	}
	m, err := messages.DecodeAnsibleDeployMessage([]byte(entries[0].Values[messages.DataField].(string)))
	if err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "send "+streams.Queue {
		t.Fatalf("spans %v", spans)
	}
	sp := spans[0]
	if sp.Parent().SpanID().String() != "00f067aa0ba902b7" || sp.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("send span's parent %v, want the caller's context", sp.Parent())
	}
	if !strings.Contains(m.Traceparent, "4bf92f3577b34da6a3ce929d0e0e4736-"+sp.SpanContext().SpanID().String()) {
		t.Errorf("request traceparent %q, want the send span's context", m.Traceparent)
	}
	if m.JobID != sub.Deployment.JobID {
		t.Errorf("job id %s, want %s", m.JobID, sub.Deployment.JobID)
	}
}
