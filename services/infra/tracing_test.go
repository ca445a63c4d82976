package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing/otlptest"
)

// TestOneTraceFromXAddToResult: a producer's span around its XADD, the
// context carried in the request, and the real infra process exporting
// over OTLP/HTTP to a local receiver give one trace: the producer's send
// span, infra's job span as its child, and the job's steps (decode, lock,
// secret resolution, SSH check, play, result publish) as children of the
// job span; the result carries the job's context on. A request without a
// trace context gets a trace of its own.
func TestOneTraceFromXAddToResult(t *testing.T) {
	t.Parallel()
	rcv := otlptest.Start()
	defer rcv.Close()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra("OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.Endpoint(), "OTEL_BSP_SCHEDULE_DELAY=50")

	// The producer: its own provider, exporting to the same receiver.
	ctx := context.Background()
	tp, err := tracing.New(ctx, tracing.Settings{TracesEndpoint: rcv.TracesURL(), ServiceName: "test-producer"}, "x")
	if err != nil {
		t.Fatal(err)
	}
	sendCtx, send := tracing.StartPublish(ctx, tp, messages.StreamProvisionerQueue)
	msg := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: "job-traced",
		TraceContext: tracing.Inject(sendCtx)}, ServerHandle: "web-1"}
	data, err := messages.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.NewProducer(e.rdb, stream.ProducerOptions{}).Publish(sendCtx, messages.StreamProvisionerQueue, data); err != nil {
		t.Fatal(err)
	}
	send.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	traceID := strings.Split(msg.Traceparent, "-")[1]

	r := e.waitProvision("job-traced", 3*time.Minute)
	if r.Status != messages.StatusSucceeded {
		t.Fatalf("result %s %+v", r.Status, r.Error)
	}
	parts := strings.Split(r.Traceparent, "-")
	if len(parts) != 4 || parts[1] != traceID {
		t.Fatalf("result traceparent %q, want one of trace %s", r.Traceparent, traceID)
	}

	want := []string{"infra job", "decode", "lock", "resolve secret", "ssh check", "play", "publish result"}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	spans, ok := rcv.WaitFor(wctx, func(spans []otlptest.Span) bool {
		seen := map[string]bool{}
		for _, s := range spans {
			if s.TraceID == traceID && s.Service == "infra" {
				seen[s.Name] = true
			}
		}
		for _, n := range want {
			if !seen[n] {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("spans of trace %s missing; received:\n%s", traceID, dump(spans))
	}
	var sendSpan, job otlptest.Span
	byName := map[string][]otlptest.Span{}
	for _, s := range spans {
		if s.TraceID != traceID {
			continue
		}
		byName[s.Name] = append(byName[s.Name], s)
		switch s.Name {
		case "send " + messages.StreamProvisionerQueue:
			sendSpan = s
		case "infra job":
			job = s
		}
	}
	if sendSpan.SpanID == "" || sendSpan.Service != "test-producer" {
		t.Fatalf("no producer span in the trace:\n%s", dump(spans))
	}
	if job.ParentID != sendSpan.SpanID {
		t.Errorf("job span's parent %s, want the producer's send span %s", job.ParentID, sendSpan.SpanID)
	}
	if parts[2] != job.SpanID {
		t.Errorf("result carries span %s, want the job span %s", parts[2], job.SpanID)
	}
	if job.Attrs["autoprov.job_id"] != "job-traced" || job.Attrs["autoprov.status"] != "succeeded" {
		t.Errorf("job span attributes %v", job.Attrs)
	}
	for _, n := range want[1:] {
		for _, s := range byName[n] {
			if s.ParentID != job.SpanID {
				t.Errorf("%s span's parent %s, want the job span %s", n, s.ParentID, job.SpanID)
			}
			if s.Start.Before(job.Start) || s.End.After(job.End) {
				t.Errorf("%s span [%v, %v] outside the job span [%v, %v]", n, s.Start, s.End, job.Start, job.End)
			}
		}
	}
	// Secrets stay out of the spans: no attribute holds the SSH key.
	for _, s := range spans {
		for k, v := range s.Attrs {
			if strings.Contains(v, "PRIVATE KEY") {
				t.Errorf("span %s attribute %s holds the key", s.Name, k)
			}
		}
	}

	// An old request, without a trace context: a trace of its own.
	e.provision("job-untraced", "web-1")
	r2 := e.waitProvision("job-untraced", 3*time.Minute)
	p2 := strings.Split(r2.Traceparent, "-")
	if r2.Status != messages.StatusSucceeded || len(p2) != 4 || p2[1] == traceID {
		t.Fatalf("untraced request: result %s with traceparent %q", r2.Status, r2.Traceparent)
	}
	// A minute of its own: the first wait's may have run out while this
	// request ran on a loaded machine.
	wctx2, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	spans, ok = rcv.WaitFor(wctx2, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.TraceID == p2[1] && s.Name == "infra job" {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no job span for the untraced request:\n%s", dump(spans))
	}
	for _, s := range spans {
		if s.TraceID == p2[1] && s.Name == "infra job" && s.ParentID != "" {
			t.Errorf("untraced request's job span has parent %s", s.ParentID)
		}
	}
}

func dump(spans []otlptest.Span) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString(s.Service + " " + s.Name + " trace=" + s.TraceID + " span=" + s.SpanID + " parent=" + s.ParentID + "\n")
	}
	return b.String()
}
