package stream_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestKeyWatcherFiresOnceTheKeyIsSet(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	w := stream.NewKeyWatcher(rdb, stream.KeyWatcherOptions{Interval: 20 * time.Millisecond})
	cancelKey, otherKey := testenv.Unique("job:cancel-"), testenv.Unique("job:other-")
	fired := make(chan string, 10)
	stopCancel := w.Watch(cancelKey, func() { fired <- cancelKey })
	stopOther := w.Watch(otherKey, func() { fired <- otherKey })
	// A watch stopped before its key is set is never called: it would
	// fire in the same check as the watch of the same key below.
	stopped := w.Watch(cancelKey, func() { fired <- "stopped watch" })
	stopped()
	if err := rdb.Set(ctx, cancelKey, "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-fired:
		if k != cancelKey {
			t.Fatalf("fired for %q, want %q", k, cancelKey)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not fire after the key was set")
	}
	stopCancel() // after firing: returns at once
	if n := w.Watching(); n != 1 {
		t.Fatalf("watching %d keys, want 1", n)
	}
	stopOther()
	if n := w.Watching(); n != 0 {
		t.Fatalf("watching %d keys, want 0", n)
	}
	select {
	case k := <-fired:
		t.Fatalf("unexpected call for %q", k)
	default:
	}
	// Watching again after the loop stopped starts it again.
	again := make(chan struct{})
	stop := w.Watch(cancelKey, func() { close(again) })
	defer stop()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("a new watch of an existing key did not fire")
	}
}

// All watched keys are checked in one round trip per interval, however many
// jobs watch them.
func TestKeyWatcherChecksAllKeysInOneRoundTrip(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	var mu sync.Mutex
	var sizes []int
	var mu2 sync.Mutex
	var singles []string
	rdb.AddHook(countingHook{
		pipeline: func(cmds []redis.Cmder) {
			if cmds[0].Name() != "exists" {
				return // a new connection's handshake
			}
			mu.Lock()
			sizes = append(sizes, len(cmds))
			mu.Unlock()
		},
		single: func(cmd redis.Cmder) {
			if cmd.Name() == "exists" { // not a new connection's handshake
				mu2.Lock()
				singles = append(singles, cmd.String())
				mu2.Unlock()
			}
		},
	})
	w := stream.NewKeyWatcher(rdb, stream.KeyWatcherOptions{Interval: 10 * time.Millisecond})
	const n = 300
	prefix := testenv.Unique("job:")
	var stops []func()
	for i := range n {
		stops = append(stops, w.Watch(prefix+strconv.Itoa(i)+":cancel", func() {}))
	}
	testenv.WaitFor(t, 10*time.Second, "three checks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sizes) >= 3
	})
	for _, stop := range stops {
		stop()
	}
	mu.Lock()
	defer mu.Unlock()
	for i, sz := range sizes[:3] {
		if sz != n {
			t.Fatalf("check %d sent %d commands in its round trip, want all %d", i, sz, n)
		}
	}
	mu2.Lock()
	defer mu2.Unlock()
	if len(singles) != 0 {
		t.Fatalf("keys checked one by one besides the pipelines: %q", singles)
	}
}

// countingHook reports each pipeline and each single command.
type countingHook struct {
	pipeline func(cmds []redis.Cmder)
	single   func(cmd redis.Cmder)
}

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.single(cmd)
		return next(ctx, cmd)
	}
}
func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipeline(cmds)
		return next(ctx, cmds)
	}
}
