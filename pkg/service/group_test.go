package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

// recorder notes what components do, in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// waiter is a component that runs until its context is canceled; started
// is closed once it runs.
func waiter(rec *recorder, name string, started chan<- struct{}) Component {
	return Component{
		Name: name,
		Run: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			rec.add("stop " + name)
			return ctx.Err() // returning the context's error counts as clean
		},
		Drain: func() { rec.add("drain " + name) },
	}
}

func TestRunComponentsOrder(t *testing.T) {
	rec := &recorder{}
	started := make(chan struct{}, 3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunComponents(ctx, zerolog.New(zerolog.NewTestWriter(t)), time.Minute,
			waiter(rec, "admin", started), waiter(rec, "worker", started), waiter(rec, "consumer", started))
	}()
	for range 3 {
		<-started
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunComponents: %v", err)
	}
	want := []string{"drain admin", "drain worker", "drain consumer", "stop consumer", "stop worker", "stop admin"}
	if diff := cmp.Diff(want, rec.get()); diff != "" {
		t.Errorf("shutdown order (-want, +got):\n%s", diff)
	}
}

func TestRunComponentsFailure(t *testing.T) {
	tests := []struct {
		name    string
		run     func(ctx context.Context) error
		wantErr error
	}{
		{"error", func(context.Context) error { return errBoom }, errBoom},
		{"early return", func(context.Context) error { return nil }, ErrStoppedEarly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			started := make(chan struct{}, 2)
			err := RunComponents(context.Background(), zerolog.New(zerolog.NewTestWriter(t)), time.Minute,
				waiter(rec, "admin", started),
				Component{Name: "bad", Run: func(ctx context.Context) error {
					<-started // fail once admin runs
					return tt.run(ctx)
				}},
			)
			if !errors.Is(err, tt.wantErr) || !strings.HasPrefix(err.Error(), "bad: ") {
				t.Errorf("RunComponents = %v, want bad: %v", err, tt.wantErr)
			}
			if diff := cmp.Diff([]string{"drain admin", "stop admin"}, rec.get()); diff != "" {
				t.Errorf("the others did not stop (-want, +got):\n%s", diff)
			}
		})
	}
}

var errBoom = errors.New("boom")

func TestRunComponentsGraceExceeded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunComponents(ctx, zerolog.New(zerolog.NewTestWriter(t)), 50*time.Millisecond,
			Component{Name: "stuck", Run: func(context.Context) error {
				close(started)
				<-release // ignores its context
				return nil
			}},
		)
	}()
	<-started
	cancel()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "still running: stuck") {
		t.Errorf("RunComponents = %v, want the stuck component named", err)
	}
}
