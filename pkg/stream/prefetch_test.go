package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// A consumer process with one handler slot and a prefetch holds three
// entries (one running, two waiting) when it is killed: all three reach
// another consumer after about a lease, as a second delivery.
func TestPrefetchedEntriesOfKilledConsumerAreRedelivered(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	const lease = time.Second
	child, started := startChildWith(t, testenv.RedisURL(t), s, g, lease, 1, 4)
	ids := publish(t, rdb, s, 3)
	if _, err := rdb.BLPop(context.Background(), 20*time.Second, started).Result(); err != nil {
		t.Fatalf("child never started an entry: %v", err)
	}
	childName := "child-" + strconv.Itoa(child.Process.Pid)
	testenv.WaitFor(t, 10*time.Second, "the child holds all three entries", func() bool {
		return len(pendingFor(t, rdb, s, g, childName)) == 3
	})
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()

	rec := newRecorder(3)
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Lease: lease}, rec))
	select {
	case <-rec.done:
	case <-time.After(lease + 10*time.Second):
		_, n := rec.snapshot()
		t.Fatalf("%d of 3 entries of the killed consumer redelivered", n)
	}
	took := time.Since(killedAt)
	t.Logf("redelivered after %v (lease %v)", took.Round(time.Millisecond), lease)
	if took < lease/2 {
		t.Fatalf("redelivered after %v, before the lease (%v) could run out", took, lease)
	}
	for _, id := range ids {
		if d := rec.delivery(id); d != 2 {
			t.Errorf("entry %s: delivery %d, want 2", id, d)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "acks", func() bool { return pendingCount(t, rdb, s, g) == 0 })
}

// Entries waiting behind a long handler are heartbeated: a second consumer
// that claims every idle entry never gets them, over many leases.
func TestPrefetchedEntriesAreHeartbeated(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	// A lease long enough that a renewal (every Lease/4) is never late by
	// a whole lease on a loaded CI machine (200 ms was, once).
	const lease = time.Second
	ev := newEvents()
	release, free := gate()
	defer free()
	var runsA atomic.Int32
	var onceDeliveries sync.Map
	a := newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Consumer: "a", Concurrency: 1, Prefetch: 4, Lease: lease, Hook: ev.hook,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		runsA.Add(1)
		onceDeliveries.Store(msg.ID, msg.Deliveries)
		if string(msg.Data()) == "0" {
			<-release // the long job
		}
		return nil
	}))
	running(t, a)
	ids := publish(t, rdb, s, 3)
	testenv.WaitFor(t, 10*time.Second, "a holds all three entries", func() bool {
		return len(pendingFor(t, rdb, s, g, "a")) == 3
	})
	var runsB atomic.Int32
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Consumer: "b", Lease: lease, ClaimInterval: 10 * time.Millisecond,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		runsB.Add(1)
		t.Errorf("entry %s taken from a live owner (delivery %d)", msg.ID, msg.Deliveries)
		return nil
	})))
	// Twelve renewals each (every Lease/4) span three leases.
	for _, id := range ids[1:] {
		ev.waitCount(t, 20*time.Second, stream.EventRenewed, id, 12)
	}
	free()
	for _, id := range ids {
		ev.waitCount(t, 10*time.Second, stream.EventAcked, id, 1)
	}
	if n := runsA.Load(); n != 3 {
		t.Fatalf("a ran %d handlers, want 3", n)
	}
	if n := runsB.Load(); n != 0 {
		t.Fatalf("b ran %d handlers, want 0", n)
	}
	for _, id := range ids {
		if d, _ := onceDeliveries.Load(id); d != int64(1) {
			t.Errorf("entry %s ran as delivery %v, want 1", id, d)
		}
	}
}

// At shutdown, entries waiting for a handler are given back at once, while
// the running handler still runs, and their delivery is not counted.
func TestShutdownReleasesPrefetchedEntriesAtOnce(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	ev := newEvents()
	ids := publish(t, rdb, s, 3)
	firstStarted := make(chan struct{})
	a := newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Consumer: "a", Concurrency: 1, Prefetch: 8,
		Lease: 30 * time.Second, ShutdownGrace: 30 * time.Second, Hook: ev.hook,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		if string(msg.Data()) != "0" {
			t.Errorf("entry %s started during shutdown", msg.Data())
			return nil
		}
		close(firstStarted)
		// Finish only once the waiting entries were released: they do not
		// wait for this handler.
		if !ev.until(20*time.Second, func() bool {
			return ev.count(stream.EventReleased, ids[1]) == 1 && ev.count(stream.EventReleased, ids[2]) == 1
		}) {
			t.Error("waiting entries not released while the running handler ran")
		}
		return nil
	}))
	stopA := running(t, a)
	<-firstStarted
	testenv.WaitFor(t, 10*time.Second, "a holds all three entries", func() bool {
		return len(pendingFor(t, rdb, s, g, "a")) == 3
	})
	stopA()
	if n := ev.count(stream.EventAcked, ids[0]); n != 1 {
		t.Fatalf("running entry acknowledged %d times, want 1", n)
	}
	// Another consumer with a 30 s lease takes the released entries at
	// once, as their first delivery.
	rec := newRecorder(2)
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 30 * time.Second, ClaimInterval: 50 * time.Millisecond,
	}, rec))
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("released entries were not taken over before the lease (30s)")
	}
	for _, id := range ids[1:] {
		if d := rec.delivery(id); d != 1 {
			t.Errorf("entry %s: delivery %d, want 1 (the prefetch is not counted)", id, d)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "acks", func() bool { return pendingCount(t, rdb, s, g) == 0 })
}

// Acknowledgements go out in batches, but an entry whose handler failed is
// never among them.
func TestBatchedAcksSkipFailedEntries(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, g := names()
	ev := newEvents()
	const n = 200
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Consumer: "a", Concurrency: 2, Prefetch: 32, Hook: ev.hook,
		Lease: 30 * time.Second, RetryBackoff: 30 * time.Second, MaxDeliveries: 10,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		i, _ := strconv.Atoi(string(msg.Data()))
		if i%3 == 0 {
			return errors.New("boom")
		}
		return nil
	})))
	ids := publish(t, rdb, s, n)
	ev.wait(t, 30*time.Second, "every entry settled", func() bool {
		return ev.count(stream.EventAcked, "")+ev.count(stream.EventRetry, "") == n
	})
	var wantPending []string
	for i, id := range ids {
		failed := i%3 == 0
		if failed {
			wantPending = append(wantPending, id)
		}
		if acked := ev.count(stream.EventAcked, id); acked != map[bool]int{true: 0, false: 1}[failed] {
			t.Errorf("entry %d (failed %v) acknowledged %d times", i, failed, acked)
		}
	}
	got := pendingFor(t, rdb, s, g, "a")
	if fmt.Sprint(got) != fmt.Sprint(wantPending) {
		t.Fatalf("pending %v,\nwant exactly the failed entries %v", got, wantPending)
	}
}

// A lease lost while the entry waited for a handler: the entry is never
// started and never acknowledged.
func TestPrefetchedEntryWithLostLeaseIsNotRun(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	ctx := context.Background()
	const lease = 200 * time.Millisecond
	ev := newEvents()
	release, free := gate()
	defer free()
	var ran sync.Map
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Consumer: "a", Concurrency: 1, Prefetch: 4, Lease: lease, Hook: ev.hook,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		ran.Store(string(msg.Data()), true)
		if string(msg.Data()) == "0" {
			<-release
		}
		return nil
	})))
	ids := publish(t, rdb, s, 2)
	testenv.WaitFor(t, 10*time.Second, "a holds both entries", func() bool {
		return len(pendingFor(t, rdb, s, g, "a")) == 2
	})
	// Another consumer takes the waiting entry and keeps it alive.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	claim := func() {
		if err := rdb.XClaimJustID(ctx, &redis.XClaimArgs{
			Stream: s, Group: g, Consumer: "intruder", MinIdle: 0, Messages: ids[1:],
		}).Err(); err != nil {
			t.Error(err)
		}
	}
	renewed := ev.count(stream.EventRenewed, ids[0])
	claim()
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
				claim()
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	// The next heartbeat finds it lost (the second renewal of the running
	// entry from now surely started after the claim); the worker then
	// skips it.
	ev.waitCount(t, 10*time.Second, stream.EventRenewed, ids[0], renewed+2)
	free()
	ev.waitCount(t, 10*time.Second, stream.EventLeft, ids[1], 1)
	ev.waitCount(t, 10*time.Second, stream.EventAcked, ids[0], 1)
	if _, ok := ran.Load("1"); ok {
		t.Fatal("the entry whose lease was lost while it waited was run")
	}
	if n := ev.count(stream.EventAcked, ids[1]); n != 0 {
		t.Fatalf("lost entry acknowledged %d times", n)
	}
	if got := pendingFor(t, rdb, s, g, "intruder"); len(got) != 1 || got[0] != ids[1] {
		t.Fatalf("pending for the intruder: %v, want [%s]", got, ids[1])
	}
}
