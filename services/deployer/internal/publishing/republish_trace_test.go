package publishing

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing/otlptest"
)

// TestRepublishTraced: a request the republisher publishes goes out in a
// producer span, exported over OTLP to a local receiver, and carries the
// span's context, so infra's job span joins that trace.
func TestRepublishTraced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recv := otlptest.Start()
	defer recv.Close()
	tp, err := tracing.New(ctx, tracing.Settings{Endpoint: recv.Endpoint(), ServiceName: "deployer"}, "deployer")
	if err != nil {
		t.Fatal(err)
	}
	s, _, rdb, streams := newTestService(t)
	s.cfg.Tracing = tp
	lost := storeUnpublished(t, s, 2*time.Minute)
	if n, err := s.republish(ctx, time.Minute); err != nil || n != 1 {
		t.Fatalf("republish: %d, %v; want 1", n, err)
	}
	if err := tp.Shutdown(ctx); err != nil { // flushes the batch
		t.Fatal(err)
	}
	_, m := republished(t, rdb, streams.Queue, lost)
	spans := recv.Spans()
	if len(spans) != 1 {
		t.Fatalf("spans %+v, want one", spans)
	}
	sp := spans[0]
	switch {
	case sp.Name != "send "+streams.Queue || sp.Kind.String() != "SPAN_KIND_PRODUCER" || sp.Service != "deployer" || sp.Error:
		t.Errorf("span %+v", sp)
	case sp.Attrs["autoprov.deployment_id"] != lost || sp.Attrs["autoprov.republished"] != "true":
		t.Errorf("span attributes %v", sp.Attrs)
	case !strings.Contains(m.Traceparent, sp.TraceID+"-"+sp.SpanID):
		t.Errorf("request traceparent %q, want the span's context %s-%s", m.Traceparent, sp.TraceID, sp.SpanID)
	}
}
