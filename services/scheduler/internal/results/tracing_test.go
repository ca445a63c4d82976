package results_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing/otlptest"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/results"
)

// TestResultSpan: a result applied with tracing on makes a consumer span
// that continues the trace the result carries (infra's job span is its
// parent), exported over OTLP to a local receiver; a result without a
// trace context starts a trace of its own.
func TestResultSpan(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('traced-1', '192.0.2.1')`); err != nil {
		t.Fatal(err)
	}
	recv := otlptest.Start()
	defer recv.Close()
	tp, err := tracing.New(ctx, tracing.Settings{Endpoint: recv.Endpoint(), ServiceName: "scheduler"}, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	h := results.New(fleet.New(db, fleet.Options{}), nil, results.Policy{}, zerolog.Nop(), nil)
	h.Tracing = tp

	// Infra's side: a job span whose context the result carries.
	jctx, job := tracing.Tracer(tp).Start(ctx, "infra job")
	traced := result(t, "job-traced", tracing.Inject(jctx))
	job.End()
	untraced := result(t, "job-untraced", messages.TraceContext{})
	for id, data := range map[string][]byte{"1-1": traced, "1-2": untraced} {
		if err := h.Handle(ctx, &stream.Message{ID: id, Values: map[string]any{messages.DataField: data}}); err != nil {
			t.Fatalf("Handle %s: %v", id, err)
		}
	}
	if err := tp.Shutdown(ctx); err != nil { // flushes the batch
		t.Fatal(err)
	}
	spans := map[string]otlptest.Span{}
	for _, s := range recv.Spans() {
		spans[s.Name+" "+s.Attrs["autoprov.job_id"]] = s
	}
	parent, ok := spans["infra job "]
	if !ok {
		t.Fatalf("no job span among %v", recv.Spans())
	}
	got, ok := spans[results.SpanApply+" job-traced"]
	switch {
	case !ok:
		t.Fatalf("no span of the traced result among %v", recv.Spans())
	case got.TraceID != parent.TraceID || got.ParentID != parent.SpanID:
		t.Errorf("result span in trace %s under %s, want trace %s under the job span %s", got.TraceID, got.ParentID, parent.TraceID, parent.SpanID)
	case got.Kind.String() != "SPAN_KIND_CONSUMER" || got.Service != "scheduler" || got.Error:
		t.Errorf("result span %+v", got)
	case got.Attrs["messaging.destination.name"] != messages.StreamProvisionerResults || got.Attrs["autoprov.server"] != "traced-1" ||
		got.Attrs["messaging.message.id"] != "1-1" || got.Attrs["autoprov.status"] != string(messages.StatusSucceeded):
		t.Errorf("result span attributes %v", got.Attrs)
	}
	own, ok := spans[results.SpanApply+" job-untraced"]
	if !ok || own.ParentID != "" || own.TraceID == parent.TraceID {
		t.Errorf("untraced result: span %+v (found %v), want a root span of a trace of its own", own, ok)
	}
}

// result encodes a succeeded result of job for server traced-1 carrying tc.
func result(t *testing.T, job string, tc messages.TraceContext) []byte {
	t.Helper()
	req := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: job}, ServerHandle: "traced-1"}
	r := messages.NewProvisionerResult(req, "0-1")
	r.Status = messages.StatusSucceeded
	r.TraceContext = tc
	data, err := messages.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
