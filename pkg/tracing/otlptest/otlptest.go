// Package otlptest is a local OTLP/HTTP trace receiver for tests: an HTTP
// server on loopback that decodes the protobuf export requests the OTLP
// exporters send (go.opentelemetry.io/proto/otlp) and keeps their spans.
// It is test code: no service binary links it.
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, with ids in hex and the service.name of its
// resource.
type Span struct {
	Service  string
	Name     string
	TraceID  string
	SpanID   string
	ParentID string // "" for a root span
	Kind     tracepb.Span_SpanKind
	Start    time.Time
	End      time.Time
	Attrs    map[string]string // string, int and bool attributes, as text
	Error    bool              // status code error
}

// Receiver collects the spans exported to it.
type Receiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	spans   []Span
	changed chan struct{}
}

// Start starts a receiver on 127.0.0.1; Close stops it.
func Start() *Receiver {
	r := &Receiver{changed: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	return r
}

// Endpoint is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) Endpoint() string { return r.srv.URL }

// TracesURL is the URL for OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
func (r *Receiver) TracesURL() string { return r.srv.URL + "/v1/traces" }

// Close stops the receiver.
func (r *Receiver) Close() { r.srv.Close() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer gz.Close()
		body = gz
	}
	data, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(data, &msg); err != nil {
		http.Error(w, "not an OTLP protobuf export request: "+err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, Name: s.GetName(), Kind: s.GetKind(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()),
					Start:    time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs: map[string]string{}, Error: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = attrText(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func attrText(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	}
	return v.String()
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor waits until done holds for the spans received, or ctx ends; it
// returns the spans at that moment and whether done held.
func (r *Receiver) WaitFor(ctx context.Context, done func([]Span) bool) ([]Span, bool) {
	for {
		r.mu.Lock()
		spans, changed := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if done(spans) {
			return spans, true
		}
		select {
		case <-ctx.Done():
			return spans, false
		case <-changed:
		}
	}
}
