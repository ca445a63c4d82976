package clocktest_test

import (
	"context"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
)

var _ clock.Clock = (*clocktest.Fake)(nil)

func TestFake(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clocktest.NewFake(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now = %v, want %v", c.Now(), start)
	}
	now := c.After(0)
	select {
	case got := <-now:
		if !got.Equal(start) {
			t.Errorf("After(0) fired with %v", got)
		}
	default:
		t.Fatal("After(0) did not fire at once")
	}

	short, long := c.After(time.Second), c.After(time.Minute)
	if c.Waiters() != 2 {
		t.Fatalf("Waiters = %d, want 2", c.Waiters())
	}
	c.Advance(time.Second)
	select {
	case got := <-short:
		if want := start.Add(time.Second); !got.Equal(want) {
			t.Errorf("short fired with %v, want %v", got, want)
		}
	default:
		t.Fatal("a due waiter did not fire")
	}
	select {
	case <-long:
		t.Fatal("a waiter fired early")
	default:
	}
	c.Advance(time.Hour)
	<-long
	if c.Waiters() != 0 {
		t.Errorf("Waiters = %d after every waiter fired", c.Waiters())
	}
}

// Sleep on a Fake returns once the test advances the clock, which it does
// after WaitForWaiters saw the sleeper waiting: no real time passes.
func TestSleepOnFake(t *testing.T) {
	c := clocktest.NewFake(time.Unix(0, 0))
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(context.Background(), c, time.Hour) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.WaitForWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Sleep returned before the clock moved: %v", err)
	default:
	}
	c.Advance(time.Hour)
	if err := <-done; err != nil {
		t.Fatalf("Sleep = %v", err)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	for name, c := range map[string]clock.Clock{"system": clock.System(), "nil": nil, "fake": clocktest.NewFake(time.Unix(0, 0))} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- clock.Sleep(ctx, c, time.Hour) }()
			cancel()
			if err := <-done; err != context.Canceled {
				t.Fatalf("Sleep = %v, want context.Canceled", err)
			}
			if err := clock.Sleep(ctx, c, 0); err != context.Canceled {
				t.Fatalf("Sleep(0) on a done context = %v, want context.Canceled", err)
			}
		})
	}
	if err := clock.Sleep(context.Background(), clock.System(), time.Millisecond); err != nil {
		t.Fatalf("Sleep on the system clock = %v", err)
	}
	if err := clock.Sleep(context.Background(), nil, 0); err != nil {
		t.Fatalf("Sleep(0) = %v", err)
	}
}
