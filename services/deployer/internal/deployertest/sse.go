package deployertest

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
)

// SSEEvent is one event read from a stream.
type SSEEvent struct {
	ID, Event, Data string
}

// SSEStream is an open event stream.
type SSEStream struct {
	Resp   *http.Response
	r      *bufio.Reader
	Retry  string // the last retry: field seen
	cancel context.CancelFunc
}

// OpenSSE opens path's event stream with key, resuming after lastID when
// it is not "".
func (e *Env) OpenSSE(t testing.TB, path, key, lastID string) *SSEStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &SSEStream{Resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel}
	t.Cleanup(s.Close)
	return s
}

// Close closes the stream.
func (s *SSEStream) Close() {
	s.cancel()
	_ = s.Resp.Body.Close()
}

// Next reads the next event; ok is false at the end of the stream.
func (s *SSEStream) Next() (ev SSEEvent, ok bool) {
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return SSEEvent{}, false
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if ev.Event != "" || ev.Data != "" {
				return ev, true
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.Event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.Data += line[6:]
		case strings.HasPrefix(line, "retry: "):
			s.Retry = line[7:]
		}
	}
}

// All reads events until the stream ends.
func (s *SSEStream) All() []SSEEvent {
	var out []SSEEvent
	for {
		ev, ok := s.Next()
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

// FollowAsEventSource follows path's event stream the way a browser's
// EventSource does: whenever a stream ends it reconnects with the id of
// the last event it got as Last-Event-ID, and it stops at a 204 (or any
// status but 200). It returns every event received and how many
// connections were made; it fails the test after maxConnects connections.
func (e *Env) FollowAsEventSource(t testing.TB, path, key string, maxConnects int) (events []SSEEvent, connects int) {
	t.Helper()
	last := ""
	for connects < maxConnects {
		s := e.OpenSSE(t, path, key, last)
		connects++
		if s.Resp.StatusCode != http.StatusOK {
			s.Close()
			if s.Resp.StatusCode != http.StatusNoContent {
				t.Errorf("reconnect with Last-Event-ID %q: status %d", last, s.Resp.StatusCode)
			}
			return events, connects
		}
		for _, ev := range s.All() {
			events = append(events, ev)
			if ev.ID != "" {
				last = ev.ID
			}
		}
		s.Close()
	}
	t.Fatalf("an EventSource client was still reconnecting after %d connections (events: %+v)", maxConnects, events)
	return events, connects
}
