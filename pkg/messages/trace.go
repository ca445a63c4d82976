package messages

import "regexp"

// Limits of the trace context keys (W3C Trace Context, level 1).
const (
	// MaxTracestateLen is the longest tracestate, in bytes: 32 list
	// members of at most 256 + 1 + 256 bytes and their separators stay
	// far below it; W3C lets a vendor drop a longer one.
	MaxTracestateLen = 512
)

// TraceparentPattern is the shape of a traceparent (W3C Trace Context):
// version, trace id, parent span id and flags in lower-case hex. Version 00
// has exactly these four fields; a later version may append more after the
// flags ("-..."); ff is never a version.
const TraceparentPattern = `^(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}|` +
	`(0[1-9a-f]|[1-9a-e][0-9a-f]|f[0-9a-e])-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[!-~]*)?)$`

// TracestatePattern is the shape of a tracestate: printable ASCII and
// spaces, list members separated by commas. Its members are the tracing
// vendors' business and are not checked further here.
const TracestatePattern = `^[ -~]*$`

var (
	traceparentRE = regexp.MustCompile(TraceparentPattern)
	tracestateRE  = regexp.MustCompile(TracestatePattern)
)

// TraceContext is the producer's trace context (W3C Trace Context) that a
// message carries on, so that the work a consumer does joins the
// producer's trace: both keys are optional, and a message without them
// starts a trace of its own (or none, when tracing is off). The services
// never act on them beyond tracing. A result carries the context of the job
// that produced it, so that a consumer of results can join the same trace.
type TraceContext struct {
	// W3C traceparent of the span that sent the message, like
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01. A trace or
	// span id of only zeros is ignored (the consumer starts a new trace).
	Traceparent string `msgpack:"traceparent,omitempty"`
	// W3C tracestate that goes with traceparent: vendor-specific list
	// members, at most 512 bytes. Ignored without traceparent.
	Tracestate string `msgpack:"tracestate,omitempty"`
}

// Traced reports whether the message carries a trace context.
func (t TraceContext) Traced() bool { return t.Traceparent != "" }

func (t *TraceContext) validate(c *checker) {
	if t.Traceparent != "" && !traceparentRE.MatchString(t.Traceparent) {
		c.add("traceparent", "must be a W3C traceparent like 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, in lower case")
	}
	switch {
	case len(t.Tracestate) > MaxTracestateLen:
		c.add("tracestate", "must be at most 512 bytes")
	case !tracestateRE.MatchString(t.Tracestate):
		c.add("tracestate", "must be printable ASCII (a W3C tracestate list)")
	}
}
