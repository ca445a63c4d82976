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

// SET job:<kind>:<id>:cancel cancels that job's run, and only that one:
// not another job, nor a job of another kind with the same id.
func TestCancelKeyCancelsTheRun(t *testing.T) {
	rdb := testenv.Redis(t)
	h := &Handler{
		Deps:    Deps{Log: zerolog.Nop()},
		cancels: stream.NewKeyWatcher(rdb, stream.KeyWatcherOptions{Interval: 10 * time.Millisecond}),
	}
	target, other := testenv.Unique("job-"), testenv.Unique("job-")
	watch := func(kind messages.JobKind, id string) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		t.Cleanup(h.watchCancel(ctx, kind, id, cancel))
		return ctx
	}
	cancelled := watch(messages.JobKindDeploy, target)
	others := map[string]context.Context{
		"another deploy":                      watch(messages.JobKindDeploy, other),
		"a provisioning job with the same id": watch(messages.JobKindProvision, target),
	}
	if err := rdb.Set(context.Background(), messages.CancelKey(messages.JobKindDeploy, target), "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("run not cancelled after its cancel key was set")
	}
	if !errors.Is(context.Cause(cancelled), errUserCancel) {
		t.Fatalf("cause %v, want errUserCancel", context.Cause(cancelled))
	}
	// All keys were checked in the same round trip.
	for name, ctx := range others {
		if ctx.Err() != nil {
			t.Errorf("%s was cancelled too: %v", name, context.Cause(ctx))
		}
	}
}
