package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// SET job:<id>:cancel cancels that job's run, and only that one.
func TestCancelKeyCancelsTheRun(t *testing.T) {
	rdb := testenv.Redis(t)
	h := &Handler{
		Deps:    Deps{Log: zerolog.Nop()},
		cancels: stream.NewKeyWatcher(rdb, stream.KeyWatcherOptions{Interval: 10 * time.Millisecond}),
	}
	target, other := testenv.Unique("job-"), testenv.Unique("job-")
	ctx1, cancel1 := context.WithCancelCause(context.Background())
	defer cancel1(nil)
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	defer cancel2(nil)
	stop1 := h.watchCancel(ctx1, target, cancel1)
	defer stop1()
	stop2 := h.watchCancel(ctx2, other, cancel2)
	defer stop2()
	if err := rdb.Set(context.Background(), messages.CancelKey(target), "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("run not cancelled after its cancel key was set")
	}
	if !errors.Is(context.Cause(ctx1), errUserCancel) {
		t.Fatalf("cause %v, want errUserCancel", context.Cause(ctx1))
	}
	// Both keys were checked in the same round trip.
	if ctx2.Err() != nil {
		t.Fatalf("the other job was cancelled too: %v", context.Cause(ctx2))
	}
}
