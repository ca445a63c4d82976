package stream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// BatchOptions configure a BatchPublisher. The zero value is usable.
type BatchOptions struct {
	// MaxLen is the approximate length kept of the stream (MAXLEN ~ on every
	// XADD). Zero means the producer's SafetyMaxLen.
	MaxLen int64
	// TTL, when positive, is set as the stream's expiry with every batch:
	// the stream disappears TTL after its last entry, also when the
	// publisher's process dies half-way.
	TTL time.Duration
	// Buffer bounds the entries waiting to be sent. Default 1024.
	Buffer int
	// MaxBatch bounds the entries sent in one pipeline. Default 64.
	MaxBatch int
	// Timeout bounds the round trip of one batch. Default 5s.
	Timeout time.Duration
	// MetricsLabel is the stream label under which the producer's metrics
	// count the published entries. Default: the stream's name. Publishers of
	// per-job streams give the name of their family instead (for example
	// "job:deploy:*:events"), so that the metric keeps few label values.
	MetricsLabel string
	// Logger receives the publisher's logs. The zero value logs nothing.
	Logger zerolog.Logger
}

// BatchStats count what a BatchPublisher did with its entries.
type BatchStats struct {
	Published int // appended to the stream
	Dropped   int // refused by Offer because the buffer was full
	Failed    int // in batches Redis did not take (not retried)
}

// BatchPublisher appends entries to one stream, in the order given, from a
// goroutine of its own that sends them in pipelined batches: callers wait
// for room in the buffer, never for Redis. It suits best-effort streams
// such as a job's progress: a batch that Redis does not take is logged and
// counted, not retried. Publish never drops an entry; Offer drops it when
// the buffer is full, so callers choose per entry what may be lost under
// pressure. Create it with Producer.NewBatchPublisher and always Close it.
type BatchPublisher struct {
	p      *Producer
	stream string
	opts   BatchOptions
	ch     chan []byte
	done   chan struct{}

	mu     sync.RWMutex // held for reading while sending to ch; Close takes it for writing
	closed bool
	stats  BatchStats // Published and Failed: owned by the loop until done
	drops  atomic.Int64
}

// NewBatchPublisher starts a BatchPublisher that appends entries with a
// DataField to stream.
func (p *Producer) NewBatchPublisher(stream string, opts BatchOptions) *BatchPublisher {
	if opts.MaxLen == 0 {
		opts.MaxLen = p.maxLen
	}
	if opts.Buffer <= 0 {
		opts.Buffer = 1024
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 64
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.MetricsLabel == "" {
		opts.MetricsLabel = stream
	}
	b := &BatchPublisher{
		p:      p,
		stream: stream,
		opts:   opts,
		ch:     make(chan []byte, opts.Buffer),
		done:   make(chan struct{}),
	}
	go b.loop()
	return b
}

// Publish queues data, waiting for room in the buffer. It returns false,
// queuing nothing, once the publisher is closed.
func (b *BatchPublisher) Publish(data []byte) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return false
	}
	b.ch <- data
	return true
}

// Offer queues data when the buffer has room and drops it otherwise
// (counted in BatchStats.Dropped). It reports whether data was queued; it
// returns false once the publisher is closed.
func (b *BatchPublisher) Offer(data []byte) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return false
	}
	select {
	case b.ch <- data:
		return true
	default:
		b.drops.Add(1)
		return false
	}
}

// Close sends what is queued, stops the publisher and returns its
// statistics. It may be called more than once.
func (b *BatchPublisher) Close() BatchStats {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.ch)
	}
	b.mu.Unlock()
	<-b.done
	st := b.stats
	st.Dropped = int(b.drops.Load())
	return st
}

// loop sends queued entries in batches until the publisher is closed.
func (b *BatchPublisher) loop() {
	defer close(b.done)
	batch := make([][]byte, 0, b.opts.MaxBatch)
	for data := range b.ch {
		batch = append(batch[:0], data)
	drain:
		for len(batch) < cap(batch) {
			select {
			case d, ok := <-b.ch:
				if !ok {
					break drain
				}
				batch = append(batch, d)
			default:
				break drain
			}
		}
		b.send(batch)
	}
}

func (b *BatchPublisher) send(batch [][]byte) {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	pipe := b.p.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(batch))
	for i, data := range batch {
		a := &redis.XAddArgs{Stream: b.stream, Values: map[string]any{DataField: data}}
		if b.opts.MaxLen > 0 {
			a.MaxLen, a.Approx = b.opts.MaxLen, true
		}
		cmds[i] = pipe.XAdd(ctx, a)
	}
	if b.opts.TTL > 0 {
		pipe.Expire(ctx, b.stream, b.opts.TTL)
	}
	_, err := pipe.Exec(ctx)
	ok := 0
	for _, c := range cmds {
		if c.Err() == nil {
			ok++
		}
	}
	b.stats.Published += ok
	b.stats.Failed += len(batch) - ok
	b.p.metrics.incPublished(b.opts.MetricsLabel, ok)
	if err != nil {
		b.opts.Logger.Warn().Err(err).Str("stream", b.stream).Int("entries", len(batch)).Int("failed", len(batch)-ok).
			Msg("batch not fully published")
	}
}
