package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/outbox"
)

// backlog is a store of n rows due; a pass publishes up to limit of them,
// failing while fail is set.
type backlog struct {
	mu     sync.Mutex
	due    int
	fail   bool
	passes []int // the limit of each pass
}

func (b *backlog) RelayBatch(_ context.Context, limit int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.passes = append(b.passes, limit)
	if b.fail {
		return 0, errors.New("redis down")
	}
	n := min(b.due, limit)
	b.due -= n
	return n, nil
}

func (b *backlog) left() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.due
}

func TestDrain(t *testing.T) {
	for _, tc := range []struct {
		name         string
		due, batch   int
		wantPasses   int
		wantReported int
	}{
		{"empty", 0, 10, 1, 0},
		{"one short batch", 7, 10, 1, 7},
		{"full batches then an empty one", 20, 10, 3, 20},
		{"full batches then a short one", 25, 10, 3, 25},
		{"default batch", 501, 0, 2, 501},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &backlog{due: tc.due}
			reported := 0
			n, err := outbox.Drain(context.Background(), b, outbox.Config{Batch: tc.batch, Published: func(n int) { reported += n }})
			if err != nil || n != tc.due || b.left() != 0 {
				t.Fatalf("drain: %d, %v, %d left; want %d, none left", n, err, b.left(), tc.due)
			}
			if len(b.passes) != tc.wantPasses || reported != tc.wantReported {
				t.Errorf("passes %v, reported %d; want %d passes, %d reported", b.passes, reported, tc.wantPasses, tc.wantReported)
			}
		})
	}
}

// TestRunRetriesAndWakes: a failing drain is retried on the next tick, and
// a wake-up makes Run look at once, long before its interval.
func TestRunRetriesAndWakes(t *testing.T) {
	b := &backlog{due: 3, fail: true}
	wake := make(chan struct{}, 1)
	drained := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- outbox.Run(ctx, b, outbox.Config{Batch: 2, Interval: 20 * time.Millisecond, Wake: wake,
			AfterDrain: func(context.Context) { drained <- struct{}{} }})
	}()
	<-drained // the first drain failed
	b.mu.Lock()
	b.fail = false
	b.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for b.left() != 0 {
		select {
		case <-drained:
		case <-deadline:
			t.Fatal("the rows were never published after the failure")
		}
	}
	// Now only a wake-up (the interval is long) publishes new rows.
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b = &backlog{}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	drained = make(chan struct{}, 16)
	go func() {
		done <- outbox.Run(ctx, b, outbox.Config{Interval: time.Hour, Wake: wake,
			AfterDrain: func(context.Context) { drained <- struct{}{} }})
	}()
	<-drained
	b.mu.Lock()
	b.due = 5
	b.mu.Unlock()
	wake <- struct{}{}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("a wake-up did not make Run look")
	}
	if b.left() != 0 {
		t.Errorf("%d rows left after the wake-up", b.left())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
