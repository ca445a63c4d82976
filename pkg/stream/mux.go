package stream

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// ReasonUnknownStream is the dead-letter reason of an entry from a stream
// no route of a Mux handles.
const ReasonUnknownStream = "unknown_stream"

// Mux is a Handler that routes each entry to the handler registered for its
// stream, like net/http's ServeMux routes requests by path. An entry from a
// stream without a route is a permanent error (reason ReasonUnknownStream):
// it is dead-lettered, never retried. A Mux is safe for concurrent use;
// routes are normally all registered before the consumer runs, and
// Streams gives the Config.Streams that match them.
type Mux struct {
	mu     sync.RWMutex
	routes map[string]Handler
}

var _ Handler = (*Mux)(nil)

// NewMux returns a Mux without routes.
func NewMux() *Mux { return &Mux{routes: map[string]Handler{}} }

// Route registers h for the entries of stream. It panics when stream is
// empty, h is nil, or stream already has a route: a program that routes
// twice is wrong, not unlucky.
func (m *Mux) Route(stream string, h Handler) {
	if stream == "" {
		panic("stream: Mux.Route with an empty stream name")
	}
	if h == nil {
		panic("stream: Mux.Route(" + stream + ") with a nil handler")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.routes[stream]; ok {
		panic("stream: Mux.Route(" + stream + ") registered twice")
	}
	m.routes[stream] = h
}

// RouteFunc registers f for the entries of stream (see Route).
func (m *Mux) RouteFunc(stream string, f func(ctx context.Context, msg *Message) error) {
	if f == nil {
		panic("stream: Mux.RouteFunc(" + stream + ") with a nil function")
	}
	m.Route(stream, HandlerFunc(f))
}

// Handler returns the handler of stream and whether there is one.
func (m *Mux) Handler(stream string) (Handler, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h, ok := m.routes[stream]
	return h, ok
}

// Streams returns the routed streams, sorted.
func (m *Mux) Streams() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.routes))
	for s := range m.routes {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Handle runs the handler of msg's stream.
func (m *Mux) Handle(ctx context.Context, msg *Message) error {
	h, ok := m.Handler(msg.Stream)
	if !ok {
		return Permanent(ReasonUnknownStream, fmt.Errorf("no handler for stream %q", msg.Stream))
	}
	return h.Handle(ctx, msg)
}
