package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/reconcile"
)

// TestRelayCarriesTraceContext: with tracing on, the relay publishes each
// request inside a producer span whose context the request carries; with
// it off, the outbox payload goes out untouched and without one.
func TestRelayCarriesTraceContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, traced := range []bool{true, false} {
		db := testenv.Pool(t)
		rdb := redis.NewClient(mustOpt(t, testenv.RedisDB(t)))
		f := fleet.New(db, fleet.Options{})
		rec := tracetest.NewSpanRecorder()
		cfg := reconcile.RelayConfig{}
		if traced {
			cfg.Tracing = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		}
		relay := reconcile.NewRelay(f, stream.NewProducer(rdb, stream.ProducerOptions{}), cfg)
		loop := reconcile.New(f, nil, nil, nil, reconcile.Config{})
		if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('s1', '192.0.2.1')`); err != nil {
			t.Fatal(err)
		}
		if _, err := loop.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := relay.Drain(ctx); err != nil || n != 1 {
			t.Fatalf("drain: %d, %v", n, err)
		}
		entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
		if err != nil || len(entries) != 1 {
			t.Fatalf("entries %v, %v", entries, err)
		}
		m, err := messages.DecodeProvisionerMessage([]byte(entries[0].Values[messages.DataField].(string)))
		if err != nil {
			t.Fatal(err)
		}
		spans := rec.Ended()
		if !traced {
			if m.Traced() || len(spans) != 0 {
				t.Errorf("tracing off: message trace context %+v, %d spans", m.TraceContext, len(spans))
			}
			continue
		}
		if len(spans) != 1 || spans[0].Name() != "send "+messages.StreamProvisionerQueue {
			t.Fatalf("spans %v", spans)
		}
		sc := spans[0].SpanContext()
		if !strings.Contains(m.Traceparent, sc.TraceID().String()+"-"+sc.SpanID().String()) {
			t.Errorf("message traceparent %q, want the send span %s", m.Traceparent, sc.SpanID())
		}
		if m.ServerHandle != "s1" || !strings.HasPrefix(m.JobID, "sched-s1-") {
			t.Errorf("message changed on the way: %+v", m)
		}
	}
}
