package stream_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// streamData returns the DataField of every entry of s, in order.
func streamData(t testing.TB, rdb redis.UniversalClient, s string) []string {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), s, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i], _ = m.Values[stream.DataField].(string)
	}
	return out
}

func TestBatchPublisherKeepsOrderAndSetsExpiry(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	reg := prometheus.NewRegistry()
	p := stream.NewProducer(rdb, stream.ProducerOptions{Metrics: stream.NewMetrics(reg)})
	b := p.NewBatchPublisher(s, stream.BatchOptions{TTL: time.Hour, MaxBatch: 16, MetricsLabel: "job:*:events"})
	const n = 500
	for i := range n {
		if !b.Publish([]byte(strconv.Itoa(i))) {
			t.Fatalf("Publish %d refused", i)
		}
	}
	st := b.Close()
	if st != (stream.BatchStats{Published: n}) {
		t.Fatalf("stats %+v, want %d published", st, n)
	}
	got := streamData(t, rdb, s)
	if len(got) != n {
		t.Fatalf("%d entries, want %d", len(got), n)
	}
	for i, d := range got {
		if d != strconv.Itoa(i) {
			t.Fatalf("entry %d is %q: out of order", i, d)
		}
	}
	ttl := rdb.TTL(context.Background(), s).Val()
	if ttl <= 0 || ttl > time.Hour {
		t.Fatalf("ttl %v, want up to an hour", ttl)
	}
	if v := metricSum(t, reg, "autoprov_stream_published_total", "job:*:events"); v != n {
		t.Fatalf("published_total{stream=job:*:events} = %v, want %d", v, n)
	}
	if v := metricSum(t, reg, "autoprov_stream_published_total", s); v != 0 {
		t.Fatalf("published_total under the stream's own name = %v, want 0", v)
	}
	// Closed: nothing more goes out; Close again is harmless.
	if b.Publish([]byte("late")) || b.Offer([]byte("late")) {
		t.Fatal("a closed publisher took an entry")
	}
	if st2 := b.Close(); st2 != st {
		t.Fatalf("second Close: %+v, want %+v", st2, st)
	}
}

func TestBatchPublisherMaxLen(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	b := stream.NewProducer(rdb, stream.ProducerOptions{}).NewBatchPublisher(s, stream.BatchOptions{MaxLen: 100})
	for range 2000 {
		b.Publish([]byte("x"))
	}
	b.Close()
	n := rdb.XLen(context.Background(), s).Val()
	// Approximate trimming keeps at least 100 and removes whole nodes only.
	if n < 100 || n >= 2000 {
		t.Fatalf("length %d with MAXLEN ~100 after 2000 entries", n)
	}
}

// While Redis is slow, Offer drops entries once the buffer is full, and
// Publish waits: what Publish queued is never lost, order is kept.
func TestBatchPublisherDropsOnlyOfferedEntries(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	// Hold the first pipeline until the test lets it go.
	entered, letGo := testenv.HoldFirstPipeline(rdb)
	defer letGo()
	b := stream.NewProducer(rdb, stream.ProducerOptions{}).NewBatchPublisher(s, stream.BatchOptions{Buffer: 3, MaxBatch: 1})
	b.Publish([]byte("first")) // taken by the loop, which then waits in Redis
	<-entered
	for _, d := range []string{"a", "b", "c"} {
		if !b.Offer([]byte(d)) {
			t.Fatalf("Offer(%s) refused with room in the buffer", d)
		}
	}
	if b.Offer([]byte("dropped")) {
		t.Fatal("Offer took an entry into a full buffer")
	}
	published := make(chan bool)
	go func() { published <- b.Publish([]byte("kept")) }()
	select {
	case <-published:
		t.Fatal("Publish returned while the buffer was full")
	default:
	}
	letGo()
	if !<-published {
		t.Fatal("Publish refused")
	}
	st := b.Close()
	if st != (stream.BatchStats{Published: 5, Dropped: 1}) {
		t.Fatalf("stats %+v", st)
	}
	if got := streamData(t, rdb, s); len(got) != 5 || got[0] != "first" || got[4] != "kept" ||
		got[1] != "a" || got[2] != "b" || got[3] != "c" {
		t.Fatalf("entries %q", got)
	}
}

func TestBatchPublisherCountsFailures(t *testing.T) {
	// Nothing listens on a port just freed: every batch fails at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	b := stream.NewProducer(rdb, stream.ProducerOptions{}).NewBatchPublisher("s", stream.BatchOptions{Timeout: time.Second})
	for range 10 {
		b.Publish([]byte("x"))
	}
	if st := b.Close(); st.Failed != 10 || st.Published != 0 {
		t.Fatalf("stats %+v, want 10 failed", st)
	}
}
