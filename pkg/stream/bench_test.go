package stream_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// benchEntries is the number of entries drained per measurement.
const benchEntries = 200_000

// fill appends n small entries in pipelined batches.
func fill(b *testing.B, rdb redis.UniversalClient, s string, n int) {
	b.Helper()
	p := stream.NewProducer(rdb, stream.ProducerOptions{SafetyMaxLen: -1})
	payload := []byte("0123456789abcdef0123456789abcdef")
	batch := make([][]byte, 1000)
	for i := range batch {
		batch[i] = payload
	}
	for done := 0; done < n; done += len(batch) {
		if _, err := p.PublishBatch(context.Background(), s, batch[:min(len(batch), n-done)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrain measures how fast a consumer drains a filled stream with a
// no-op handler, at several concurrencies, with and without prefetch, next
// to a raw baseline: a bare XREADGROUP COUNT 100 + XACK loop without any of
// the runtime's guarantees. On a machine whose load changes, each consumer
// measurement is paired with a raw drain just before it: x-raw is the ratio
// of the two. Each run drains benchEntries entries.
func BenchmarkDrain(b *testing.B) {
	rdb := testenv.Redis(b)
	b.Run("raw-xreadgroup-count100", func(b *testing.B) {
		for range b.N {
			b.ReportMetric(rawDrain(b, rdb), "msgs/s")
		}
	})
	for _, conc := range []int{1, 8, 64} {
		for _, prefetch := range []int{0, benchPrefetch} {
			name := fmt.Sprintf("consumer-concurrency-%d", conc)
			if prefetch > 0 {
				name += fmt.Sprintf("-prefetch-%d", prefetch)
			}
			b.Run(name, func(b *testing.B) {
				for range b.N {
					raw := rawDrain(b, rdb)
					rate := benchDrain(b, rdb, conc, prefetch)
					b.ReportMetric(rate, "msgs/s")
					b.ReportMetric(raw, "raw-msgs/s")
					b.ReportMetric(rate/raw, "x-raw")
				}
			})
		}
	}
}

// benchPrefetch is the prefetch of the drain benchmarks that use one.
const benchPrefetch = 256

// rawDrain drains benchEntries entries with a bare XREADGROUP COUNT 100 +
// XACK loop and returns the rate.
func rawDrain(b *testing.B, rdb redis.UniversalClient) float64 {
	b.StopTimer()
	ctx := context.Background()
	s, g := names()
	fill(b, rdb, s, benchEntries)
	rdb.XGroupCreate(ctx, s, g, "0")
	b.StartTimer()
	start := time.Now()
	for done := 0; done < benchEntries; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "raw", Streams: []string{s, ">"}, Count: 100, Block: -1}).Result()
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, 0, 100)
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		if err := rdb.XAck(ctx, s, g, ids...).Err(); err != nil {
			b.Fatal(err)
		}
		done += len(ids)
	}
	rate := float64(benchEntries) / time.Since(start).Seconds()
	b.StopTimer()
	rdb.Del(ctx, s)
	b.StartTimer()
	return rate
}

// benchDrain drains benchEntries entries with a consumer and returns the
// rate up to the last acknowledgement.
func benchDrain(b *testing.B, rdb redis.UniversalClient, conc, prefetch int) float64 {
	b.StopTimer()
	ctx := context.Background()
	s, g := names()
	fill(b, rdb, s, benchEntries)
	// Count the drain as done when every entry is acknowledged.
	var acked atomic.Int64
	done := make(chan struct{})
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group: g, Streams: []string{s}, Concurrency: conc, Prefetch: prefetch,
		Hook: func(ev stream.Event) {
			if ev.Kind == stream.EventAcked && acked.Add(1) == benchEntries {
				close(done)
			}
		},
	}, stream.HandlerFunc(func(context.Context, *stream.Message) error { return nil }))
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { _ = c.Run(runCtx); close(stopped) }()
	<-done
	rate := float64(benchEntries) / time.Since(start).Seconds()
	b.StopTimer()
	cancel()
	<-stopped
	if p, err := rdb.XPending(ctx, s, g).Result(); err != nil || p.Count != 0 {
		b.Fatalf("after the drain: pending %+v, err %v", p, err)
	}
	rdb.Del(ctx, s)
	b.StartTimer()
	return rate
}

// BenchmarkLatency measures the time from XADD to the handler's start at a
// fixed rate of 1,000 entries/s for 5 s. Run with -benchtime=1x.
func BenchmarkLatency(b *testing.B) {
	rdb := testenv.Redis(b)
	ctx := context.Background()
	const rate, total = 1000, 5000
	for range b.N {
		s, g := names()
		lat := make([]time.Duration, 0, total)
		got := make(chan time.Duration, total)
		c, err := stream.NewConsumer(rdb, stream.Config{Group: g, Streams: []string{s}, Concurrency: 8},
			stream.HandlerFunc(func(_ context.Context, msg *stream.Message) error {
				sent := int64(binary.BigEndian.Uint64(msg.Data()))
				got <- time.Duration(time.Now().UnixNano() - sent)
				return nil
			}))
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		go func() { _ = c.Run(runCtx); close(stopped) }()
		// Measure from when the consumer's reader is blocked on the stream.
		testenv.WaitFor(b, 10*time.Second, "the consumer reading", func() bool {
			cs, err := rdb.XInfoConsumers(ctx, s, g).Result()
			return err == nil && len(cs) == 1
		})
		p := stream.NewProducer(rdb, stream.ProducerOptions{})
		tick := time.NewTicker(time.Second / rate)
		buf := make([]byte, 8)
		b.ResetTimer()
		for range total {
			<-tick.C
			binary.BigEndian.PutUint64(buf, uint64(time.Now().UnixNano()))
			if _, err := p.Publish(ctx, s, buf); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		for range total {
			lat = append(lat, <-got)
		}
		b.StopTimer()
		cancel()
		<-stopped
		slices.Sort(lat)
		q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
		b.ReportMetric(q(0.50), "p50-µs")
		b.ReportMetric(q(0.99), "p99-µs")
		b.ReportMetric(q(0.999), "p99.9-µs")
		rdb.Del(ctx, s)
	}
}

// BenchmarkRedeliveryAfterKill measures how long an entry held by a consumer
// process killed with SIGKILL takes to reach another consumer, with a 5 s
// lease, for kills at several points of the job: right after delivery, and
// later (a heartbeat renewed the lease some time before the kill, so less
// of the lease is left). Run with -benchtime=1x.
func BenchmarkRedeliveryAfterKill(b *testing.B) {
	const lease = 5 * time.Second
	for _, after := range []time.Duration{0, lease / 4, lease / 2, 3 * lease / 4, 2 * lease} {
		b.Run("killed_after="+after.String(), func(b *testing.B) { benchRedeliveryAfterKill(b, lease, after) })
	}
}

func benchRedeliveryAfterKill(b *testing.B, lease, after time.Duration) {
	rdb := testenv.Redis(b)
	ctx := context.Background()
	for range b.N {
		s, g := names()
		child, started := startChild(b, testenv.RedisURL(b), s, g, lease)
		publish(b, rdb, s, 1)
		if _, err := rdb.BLPop(ctx, 20*time.Second, started).Result(); err != nil {
			b.Fatalf("child never started the entry: %v", err)
		}
		got := make(chan time.Time, 1)
		c, err := stream.NewConsumer(rdb, stream.Config{Group: g, Streams: []string{s}, Lease: lease},
			stream.HandlerFunc(func(context.Context, *stream.Message) error {
				got <- time.Now()
				return nil
			}))
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		go func() { _ = c.Run(runCtx); close(stopped) }()
		time.Sleep(after)
		b.ResetTimer()
		killed := time.Now()
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-got:
		case <-time.After(lease + 30*time.Second):
			b.Fatal("entry not redelivered")
		}
		b.StopTimer()
		b.ReportMetric(at.Sub(killed).Seconds(), "redelivery-s")
		b.ReportMetric(lease.Seconds(), "lease-s")
		cancel()
		<-stopped
		rdb.Del(ctx, s)
	}
}
