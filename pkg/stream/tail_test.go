package stream_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// tailLog records what a Tail handed over, batch by batch.
type tailLog struct {
	mu      sync.Mutex
	batches [][]string // entry ids
	data    []string   // payloads of successful batches, in order
	fail    int        // how many more calls fail
}

func (l *tailLog) handle(_ context.Context, msgs []*stream.Message) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	l.batches = append(l.batches, ids)
	if l.fail > 0 {
		l.fail--
		return errors.New("store down")
	}
	for _, m := range msgs {
		l.data = append(l.data, string(m.Data()))
	}
	return nil
}

func (l *tailLog) snapshot() ([]string, [][]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.data...), append([][]string(nil), l.batches...)
}

func runTail(t *testing.T, rdb redis.UniversalClient, cfg stream.TailConfig, h stream.TailHandler) {
	t.Helper()
	tail, err := stream.NewTail(rdb, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tail.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tail: %v", err)
		}
	})
}

func TestTailFromNowSkipsOlderEntries(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	publish(t, rdb, s, 5) // "0".."4": before the tail starts
	log := &tailLog{}
	runTail(t, rdb, stream.TailConfig{Stream: s, Block: 50 * time.Millisecond}, log.handle)
	// Publish until the tail sees something: it pins "now" when it
	// starts, and may start after any of these.
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	next := 0
	testenv.WaitFor(t, 20*time.Second, "the tail to see new entries", func() bool {
		if _, err := p.Publish(context.Background(), s, []byte("new-"+strconv.Itoa(next))); err != nil {
			t.Fatal(err)
		}
		next++
		data, _ := log.snapshot()
		return len(data) > 0
	})
	// Everything from the first seen on arrives, in order, and nothing
	// older than the tail.
	testenv.WaitFor(t, 20*time.Second, "the tail to catch up", func() bool {
		data, _ := log.snapshot()
		return len(data) > 0 && data[len(data)-1] == "new-"+strconv.Itoa(next-1)
	})
	data, _ := log.snapshot()
	first, err := strconv.Atoi(data[0][len("new-"):])
	if err != nil {
		t.Fatalf("the tail handed over an entry older than itself: %q (all: %v)", data[0], data)
	}
	for i, d := range data {
		if want := "new-" + strconv.Itoa(first+i); d != want {
			t.Fatalf("entry %d is %q, want %q (all: %v)", i, d, want, data)
		}
	}
}

// TestTailPauseBatchesASteadyFlow: with Pause, entries published one at a
// time reach the handler in a few batches (not one read per entry), all of
// them, in order; a full batch (Count entries) is not followed by a pause.
func TestTailPauseBatchesASteadyFlow(t *testing.T) {
	rdb := testenv.Redis(t)
	s, _ := names()
	log := &tailLog{}
	runTail(t, rdb, stream.TailConfig{Stream: s, From: "0", Count: 100, Block: 50 * time.Millisecond, Pause: 200 * time.Millisecond}, log.handle)
	const n = 40
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	for i := range n { // about 400 ms of entries, 10 ms apart
		if _, err := p.Publish(context.Background(), s, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	testenv.WaitFor(t, 20*time.Second, "the tail to hand over every entry", func() bool {
		data, _ := log.snapshot()
		return len(data) == n
	})
	data, batches := log.snapshot()
	for i, d := range data {
		if d != strconv.Itoa(i) {
			t.Fatalf("entry %d is %q, want %d (all: %v)", i, d, i, data)
		}
	}
	if len(batches) > n/4 {
		t.Errorf("%d entries came in %d batches; with a 200 ms pause, want a few", n, len(batches))
	}

	// Full batches follow each other without a pause (an hour here).
	s2, _ := names()
	publish(t, rdb, s2, 30)
	full := &tailLog{}
	runTail(t, rdb, stream.TailConfig{Stream: s2, From: "0", Count: 10, Block: 50 * time.Millisecond, Pause: time.Hour}, full.handle)
	testenv.WaitFor(t, 20*time.Second, "three full batches", func() bool {
		data, _ := full.snapshot()
		return len(data) == 30
	})
}

func TestTailHandsAFailedBatchOverAgain(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	ids := publish(t, rdb, s, 30)
	log := &tailLog{fail: 2}
	// From the first entry: the 29 after it, 10 at a time.
	runTail(t, rdb, stream.TailConfig{Stream: s, From: ids[0], Count: 10, Block: 50 * time.Millisecond}, log.handle)
	testenv.WaitFor(t, 30*time.Second, "the tail to hand over every entry", func() bool {
		data, _ := log.snapshot()
		return len(data) >= 29
	})
	data, batches := log.snapshot()
	if len(data) != 29 {
		t.Fatalf("handed over %d entries, want 29 (each once it succeeded)", len(data))
	}
	for i, d := range data {
		if d != strconv.Itoa(i+1) {
			t.Fatalf("entry %d is %q, want %d: order or gap (all: %v)", i, d, i+1, data)
		}
	}
	// The two failed calls and the successful one got the same batch.
	if len(batches) < 3 || batches[0][0] != ids[1] || batches[1][0] != ids[1] || batches[2][0] != ids[1] ||
		len(batches[0]) != 10 || len(batches[2]) != 10 {
		t.Fatalf("batches after a failure: %v", batches)
	}
}

func TestTailRefusesBadConfig(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	h := func(context.Context, []*stream.Message) error { return nil }
	for _, tc := range []struct {
		name string
		cfg  stream.TailConfig
		h    stream.TailHandler
	}{
		{"no stream", stream.TailConfig{}, h},
		{"bad from", stream.TailConfig{Stream: "s", From: "yesterday"}, h},
		{"no handler", stream.TailConfig{Stream: "s"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := stream.NewTail(rdb, tc.cfg, tc.h); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
