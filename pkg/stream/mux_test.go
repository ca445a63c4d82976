package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestMuxRoutesByStream(t *testing.T) {
	t.Parallel()
	var got []string
	m := stream.NewMux()
	m.RouteFunc("a", func(_ context.Context, msg *stream.Message) error {
		got = append(got, "a:"+msg.ID)
		return nil
	})
	m.Route("b", stream.HandlerFunc(func(_ context.Context, msg *stream.Message) error {
		got = append(got, "b:"+msg.ID)
		return errors.New("b failed")
	}))
	tests := []struct {
		stream    string
		wantErr   string
		permanent bool
	}{
		{stream: "a"},
		{stream: "b", wantErr: "b failed"},
		{stream: "c", wantErr: `unknown_stream: no handler for stream "c"`, permanent: true},
		{stream: "", wantErr: `no handler for stream ""`, permanent: true},
	}
	for _, tt := range tests {
		err := m.Handle(context.Background(), &stream.Message{Stream: tt.stream, ID: "1-0"})
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("stream %q: %v", tt.stream, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("stream %q: error %v, want %q", tt.stream, err, tt.wantErr)
		}
		var perm *stream.PermanentError
		if isPerm := errors.As(err, &perm); isPerm != tt.permanent {
			t.Errorf("stream %q: permanent %v, want %v", tt.stream, isPerm, tt.permanent)
		} else if isPerm && perm.Reason != stream.ReasonUnknownStream {
			t.Errorf("stream %q: reason %q", tt.stream, perm.Reason)
		}
	}
	if want := []string{"a:1-0", "b:1-0"}; !slices.Equal(got, want) {
		t.Fatalf("handlers ran %v, want %v", got, want)
	}
	if s := m.Streams(); !slices.Equal(s, []string{"a", "b"}) {
		t.Fatalf("Streams() = %v", s)
	}
	if _, ok := m.Handler("c"); ok {
		t.Fatal("Handler(c) found a route")
	}
}

func TestMuxRejectsBadRoutes(t *testing.T) {
	t.Parallel()
	h := stream.HandlerFunc(func(context.Context, *stream.Message) error { return nil })
	tests := []struct {
		name  string
		route func(m *stream.Mux)
		want  string
	}{
		{"empty stream", func(m *stream.Mux) { m.Route("", h) }, "empty stream"},
		{"nil handler", func(m *stream.Mux) { m.Route("x", nil) }, "nil handler"},
		{"nil func", func(m *stream.Mux) { m.RouteFunc("x", nil) }, "nil function"},
		{"twice", func(m *stream.Mux) { m.Route("a", h) }, "registered twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := stream.NewMux()
			m.Route("a", h)
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tt.want) {
					t.Fatalf("panic %v, want one mentioning %q", r, tt.want)
				}
			}()
			tt.route(m)
		})
	}
}

// A consumer serving a Mux: each stream's entries reach their own handler;
// the entry of a stream without a route is dead-lettered at once.
func TestMuxUnderConsumer(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	a, g := names()
	b, _ := names()
	orphan, _ := names()
	recA, recB := newRecorder(3), newRecorder(2)
	m := stream.NewMux()
	m.Route(a, recA)
	m.Route(b, recB)
	ev := newEvents()
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: append(m.Streams(), orphan), MaxDeliveries: 5, Hook: ev.hook,
	}, m))
	publish(t, rdb, a, 3)
	publish(t, rdb, b, 2)
	orphanIDs := publish(t, rdb, orphan, 1)
	for _, rec := range []*recorder{recA, recB} {
		select {
		case <-rec.done:
		case <-time.After(20 * time.Second):
			t.Fatal("routed entries not handled")
		}
	}
	ev.waitCountIn(t, 10*time.Second, stream.EventAcked, orphan, orphanIDs[0], 1)
	dead := deadEntries(t, rdb, orphan)
	if len(dead) != 1 || dead[0].Values[stream.DeadFieldReason] != stream.ReasonUnknownStream ||
		dead[0].Values[stream.DeadFieldDeliveries] != "1" {
		t.Fatalf("dead letters of the unrouted stream: %+v", dead)
	}
	if runs, _ := recA.snapshot(); len(runs) != 3 {
		t.Fatalf("a ran %v", runs)
	}
	if runs, _ := recB.snapshot(); len(runs) != 2 {
		t.Fatalf("b ran %v", runs)
	}
}
