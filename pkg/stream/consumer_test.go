package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestSeveralConsumersNoLossNoDuplicates(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, g := names()
	const n = 3000
	rec := newRecorder(n)
	reg := prometheus.NewRegistry()
	metrics := stream.NewMetrics(reg)
	for range 3 {
		c := newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Concurrency: 8, Metrics: metrics}, rec)
		running(t, c)
	}
	publish(t, rdb, s, n)
	select {
	case <-rec.done:
	case <-time.After(60 * time.Second):
		_, total := rec.snapshot()
		t.Fatalf("processed %d of %d entries", total, n)
	}
	runs, total := rec.snapshot()
	if total != n || len(runs) != n {
		t.Fatalf("total runs %d, distinct %d, want %d each", total, len(runs), n)
	}
	for i := range n {
		if got := runs[strconv.Itoa(i)]; got != 1 {
			t.Fatalf("entry %d ran %d times", i, got)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "all entries acknowledged", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	// The counter moves after the XACK returns: wait for it too, then check
	// that it does not overshoot.
	testenv.WaitFor(t, 10*time.Second, "acked_total to count every entry", func() bool {
		return metricSum(t, reg, "autoprov_stream_acked_total", s) >= n
	})
	if got := metricSum(t, reg, "autoprov_stream_acked_total", s); got != n {
		t.Fatalf("acked_total = %v, want %d", got, n)
	}
}

// metricSum sums the samples of a counter or gauge family for stream s.
func metricSum(t *testing.T, reg *prometheus.Registry, name, s string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stream" && l.GetValue() == s {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

func TestKilledConsumerEntryIsReclaimed(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	const lease = time.Second
	child, started := startChild(t, testenv.RedisURL(t), s, g, lease)
	ids := publish(t, rdb, s, 1)

	// The child process takes the entry and hangs in its handler.
	got, err := rdb.BLPop(context.Background(), 20*time.Second, started).Result()
	if err != nil {
		t.Fatalf("child never started the entry: %v", err)
	}
	if got[1] != ids[0] {
		t.Fatalf("child started %s, want %s", got[1], ids[0])
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()

	var deliveries, pickup atomic.Int64
	rec := newRecorder(1)
	rec.fn = func(_ context.Context, msg *stream.Message) error {
		deliveries.Store(msg.Deliveries)
		pickup.Store(int64(msg.Pickup))
		return nil
	}
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Lease: lease}, rec))
	select {
	case <-rec.done:
	case <-time.After(lease + 10*time.Second):
		t.Fatal("entry of the killed consumer was not reclaimed")
	}
	t.Logf("redelivered %v after kill -9 (lease %v)", time.Since(killedAt).Round(time.Millisecond), lease)
	if d := deliveries.Load(); d != 2 {
		t.Fatalf("deliveries = %d, want 2", d)
	}
	// A claimed entry's pickup counts from its claim round, not from its
	// arrival or its first consumer's death.
	if p := time.Duration(pickup.Load()); p <= 0 || p >= lease {
		t.Errorf("the claimed entry's Pickup = %v, want in (0, %v): from its claim to its start", p, lease)
	}
	testenv.WaitFor(t, 5*time.Second, "ack", func() bool { return pendingCount(t, rdb, s, g) == 0 })
}

func TestLongJobIsNeverTakenFromLiveOwner(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	// A lease a loaded CI machine's stalls fit in (renewed every 750 ms):
	// at load 40 (the infra outage tests' 40 plays beside it) a one-second
	// lease was missed once.
	const lease = 3 * time.Second

	// The job lasts until its lease was renewed 24 times (six leases) and
	// the consumers ran 100 claim rounds meanwhile, in which a wrong claim
	// would have happened: signals, not a duration the machine's load could
	// stretch.
	ev := newEvents()
	jobOver := make(chan struct{})
	var runs atomic.Int32
	var sawCancel atomic.Bool
	done := make(chan struct{})
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		if runs.Add(1) > 1 {
			t.Errorf("entry %s delivered again (delivery %d) while its owner lives", msg.ID, msg.Deliveries)
			return nil
		}
		rounds := ev.count(stream.EventClaimRound, "")
		go func() {
			if ev.until(2*time.Minute, func() bool {
				return ev.count(stream.EventRenewed, msg.ID) >= 24 && ev.count(stream.EventClaimRound, "") >= rounds+100
			}) {
				close(jobOver)
			}
		}()
		select {
		case <-jobOver:
		case <-ctx.Done():
			sawCancel.Store(true)
			return ctx.Err()
		}
		close(done)
		return nil
	})
	// Three consumers compete; whichever takes the entry must keep it.
	for range 3 {
		running(t, newConsumer(t, rdb, stream.Config{
			Group: g, Streams: []string{s}, Lease: lease, ClaimInterval: 20 * time.Millisecond, Hook: ev.hook,
		}, h))
	}
	publish(t, rdb, s, 1)
	select {
	case <-done:
	case <-time.After(2*time.Minute + 10*time.Second):
		t.Fatal("job did not finish")
	}
	if sawCancel.Load() {
		t.Fatal("the handler's context was cancelled: lease lost")
	}
	testenv.WaitFor(t, 5*time.Second, "ack", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	if got := runs.Load(); got != 1 {
		t.Fatalf("runs = %d, want 1", got)
	}
}

func TestDeadLetterAtDeliveryLimit(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	var calls atomic.Int32
	var seen []int64
	var mu sync.Mutex
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		calls.Add(1)
		mu.Lock()
		seen = append(seen, msg.Deliveries)
		mu.Unlock()
		return errors.New("boom")
	})
	reg := prometheus.NewRegistry()
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 200 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		MaxDeliveries: 3, RetryBackoff: 10 * time.Millisecond, Metrics: stream.NewMetrics(reg),
	}, h))
	ids := publish(t, rdb, s, 1)
	testenv.WaitFor(t, 20*time.Second, "dead-letter entry", func() bool { return len(deadEntries(t, rdb, s)) == 1 })
	dead := deadEntries(t, rdb, s)[0]
	want := map[string]string{
		"data":                     "0",
		stream.DeadFieldReason:     "max_deliveries",
		stream.DeadFieldStream:     s,
		stream.DeadFieldID:         ids[0],
		stream.DeadFieldGroup:      g,
		stream.DeadFieldDeliveries: "3",
	}
	for k, v := range want {
		if dead.Values[k] != v {
			t.Errorf("dead entry %s = %v, want %q", k, dead.Values[k], v)
		}
	}
	if e, _ := dead.Values[stream.DeadFieldError].(string); !strings.Contains(e, "boom") {
		t.Errorf("dead_error = %q, want the handler's error", e)
	}
	testenv.WaitFor(t, 5*time.Second, "ack", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	if got := calls.Load(); got != 3 {
		t.Fatalf("handler called %d times, want 3", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[1 2 3]" {
		t.Fatalf("deliveries seen %v, want [1 2 3]", seen)
	}
	if got := metricSum(t, reg, "autoprov_stream_dead_lettered_total", s); got != 1 {
		t.Fatalf("dead_lettered_total = %v, want 1", got)
	}
}

func TestMalformedEntriesDeadLetterWithReason(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	var calls atomic.Int32
	// A handler that decodes its input: bad input is a permanent error; a
	// payload that makes it panic is retried up to the limit.
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		calls.Add(1)
		data := msg.Data()
		switch {
		case data == nil:
			return stream.Permanent("invalid_message", errors.New("entry has no data field"))
		case string(data) == "panic":
			panic("decoder exploded")
		case !strings.HasPrefix(string(data), "ok"):
			return stream.Permanent("invalid_message", fmt.Errorf("cannot decode %q", data))
		}
		return nil
	})
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 200 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		MaxDeliveries: 2, RetryBackoff: 10 * time.Millisecond,
	}, h))
	ctx := context.Background()
	for _, v := range []map[string]any{
		{"other": "x"}, {"data": "\xc1garbage"}, {"data": "panic"}, {"data": "ok-1"},
	} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "three dead-letter entries", func() bool { return len(deadEntries(t, rdb, s)) == 3 })
	reasons := map[string]string{}
	for _, d := range deadEntries(t, rdb, s) {
		key, _ := d.Values["data"].(string)
		if key == "" {
			key = "no-data:" + fmt.Sprint(d.Values["other"])
		}
		reasons[key] = d.Values[stream.DeadFieldReason].(string) + " / " + d.Values[stream.DeadFieldError].(string)
	}
	for key, want := range map[string]string{
		"no-data:x":   "invalid_message / invalid_message: entry has no data field",
		"\xc1garbage": "invalid_message / invalid_message: cannot decode",
		"panic":       "max_deliveries / failed on delivery 2 of 2: handler panic: decoder exploded",
	} {
		if !strings.HasPrefix(reasons[key], want) {
			t.Errorf("dead entry %q: got %q, want prefix %q", key, reasons[key], want)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "acks", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	// 1 (no data) + 1 (garbage) + 2 (panic) + 1 (ok)
	if got := calls.Load(); got != 5 {
		t.Fatalf("handler calls = %d, want 5", got)
	}
}

func TestGracefulShutdownReleasesEntries(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	started := make(chan string, 2)
	// A's handler finishes the quick entry within the grace period and
	// hangs on the slow one until cancelled.
	a := newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 30 * time.Second, ShutdownGrace: 300 * time.Millisecond,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		started <- string(msg.Data())
		if string(msg.Data()) == "0" {
			time.Sleep(100 * time.Millisecond)
			return nil
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), stream.ErrShutdown) {
			t.Errorf("cause = %v, want ErrShutdown", context.Cause(ctx))
		}
		return ctx.Err()
	}))
	stopA := running(t, a)
	publish(t, rdb, s, 2)
	<-started
	<-started
	stopA()
	// Entry 0 finished during the drain and was acknowledged; entry 1 was
	// released: B, with a 30 s lease, takes it at once, and the interrupted
	// delivery is not counted.
	var deliveries atomic.Int64
	rec := newRecorder(1)
	rec.fn = func(_ context.Context, msg *stream.Message) error {
		deliveries.Store(msg.Deliveries)
		return nil
	}
	t0 := time.Now()
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 30 * time.Second, ClaimInterval: 50 * time.Millisecond,
	}, rec))
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("released entry was not taken over before the lease (30s)")
	}
	t.Logf("released entry taken over after %v", time.Since(t0).Round(time.Millisecond))
	runs, _ := rec.snapshot()
	if runs["1"] != 1 || runs["0"] != 0 {
		t.Fatalf("B ran %v; want only entry 1", runs)
	}
	if d := deliveries.Load(); d != 1 {
		t.Fatalf("deliveries = %d, want 1 (the interrupted delivery is not counted)", d)
	}
	testenv.WaitFor(t, 5*time.Second, "acks", func() bool { return pendingCount(t, rdb, s, g) == 0 })
}

func TestLeaseLostCancelsHandlerAndAcksNothing(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	ctx := context.Background()
	cancelled := make(chan error, 1)
	started := make(chan struct{}, 1)
	var runs atomic.Int32
	ev := newEvents()
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Lease: time.Second, Hook: ev.hook},
		stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
			runs.Add(1)
			started <- struct{}{}
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			return nil // even a "success" must not be acknowledged now
		})))
	ids := publish(t, rdb, s, 1)
	<-started
	// Another consumer takes the entry (as it would after a network split)
	// and stays alive: it renews its claim like a heartbeat would.
	intruder := func() {
		if err := rdb.XClaimJustID(ctx, &redis.XClaimArgs{
			Stream: s, Group: g, Consumer: "intruder", MinIdle: 0, Messages: ids,
		}).Err(); err != nil {
			t.Error(err)
		}
	}
	intruder()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
				intruder()
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, stream.ErrLeaseLost) {
			t.Fatalf("cause = %v, want ErrLeaseLost", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler not cancelled after its lease was lost")
	}
	// The consumer lets go of the entry once the handler returned; after
	// that, nothing of it is left to acknowledge. Three claim rounds later
	// (every Lease/4) a wrong reclaim would have happened.
	ev.waitCount(t, 5*time.Second, stream.EventLeft, ids[0], 1)
	rounds := ev.count(stream.EventClaimRound, "")
	ev.waitCount(t, 10*time.Second, stream.EventClaimRound, "", rounds+3)
	if n := ev.count(stream.EventAcked, ids[0]); n != 0 {
		t.Fatalf("the lost entry was acknowledged %d times", n)
	}
	p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: g, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].Consumer != "intruder" || p[0].RetryCount != 1 {
		t.Fatalf("pending = %+v, want the entry still pending for the intruder, delivered once", p)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestOwnPendingEntriesReRunAtStart(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, g := names()
	ctx := context.Background()
	const name = "stable-consumer"
	if err := rdb.XGroupCreateMkStream(ctx, s, g, "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, rdb, s, 3)
	// A previous incarnation read all three and died; entry 1 was deleted
	// from the stream meanwhile.
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: name, Streams: []string{s, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XDel(ctx, s, ids[1]).Err(); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(2)
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Consumer: name, Lease: time.Minute}, rec))
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second): // far less than the lease
		t.Fatal("own pending entries were not re-run at start")
	}
	runs, _ := rec.snapshot()
	if runs["0"] != 1 || runs["2"] != 1 || len(runs) != 2 {
		t.Fatalf("runs = %v, want entries 0 and 2 once", runs)
	}
	testenv.WaitFor(t, 5*time.Second, "acks (the deleted entry too)", func() bool { return pendingCount(t, rdb, s, g) == 0 })
}

func TestDeletedPendingEntriesAreDropped(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, s, g, "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, rdb, s, 2)
	// A dead consumer held both; one was trimmed away before anyone retried.
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "dead", Streams: []string{s, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XDel(ctx, s, ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec := newRecorder(1)
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 100 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		Metrics: stream.NewMetrics(reg),
	}, rec))
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("surviving entry not reclaimed")
	}
	testenv.WaitFor(t, 5*time.Second, "empty pending list", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	if got := metricSum(t, reg, "autoprov_stream_deleted_pending_total", s); got != 1 {
		t.Fatalf("deleted_pending_total = %v, want 1", got)
	}
	if runs, _ := rec.snapshot(); runs["1"] != 1 || len(runs) != 1 {
		t.Fatalf("runs = %v", runs)
	}
}

func TestGroupRecreatedAfterRedisLostData(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, g := names()
	rec := newRecorder(2)
	ev := newEvents()
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Block: 50 * time.Millisecond, Hook: ev.hook}, rec))
	publish(t, rdb, s, 1)
	testenv.WaitFor(t, 10*time.Second, "first entry", func() bool { _, n := rec.snapshot(); return n == 1 })
	// The stream and its group vanish (Redis restarted without persistence).
	if err := rdb.Del(context.Background(), s).Err(); err != nil {
		t.Fatal(err)
	}
	ev.waitCount(t, 10*time.Second, stream.EventGroupCreated, "", 1) // the reader hit NOGROUP
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s, Values: map[string]any{"data": "after"}}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("entry published after the group vanished was not consumed")
	}
	if runs, _ := rec.snapshot(); runs["after"] != 1 {
		t.Fatalf("runs = %v", runs)
	}
}

func TestRedisRestartLosesNothing(t *testing.T) {
	for _, kill := range []bool{false, true} {
		name := "graceful-restart"
		if kill {
			name = "kill-9"
		}
		t.Run(name, func(t *testing.T) {
			srv := testenv.StartRedisServer(t)
			rdb := srv.Client(func(o *redis.Options) {
				o.MaxRetries = 1
				o.DialTimeout = 200 * time.Millisecond
			})
			s, g := names()
			const n = 2000
			rec := newRecorder(n)
			for range 2 {
				running(t, newConsumer(t, rdb, stream.Config{
					Group: g, Streams: []string{s}, Concurrency: 8, Lease: 2 * time.Second,
					Block: 100 * time.Millisecond, ClaimInterval: 100 * time.Millisecond,
				}, rec))
			}
			// The producer keeps publishing through the outage, retrying
			// each entry until Redis acknowledges it.
			p := stream.NewProducer(rdb, stream.ProducerOptions{})
			published := make(chan struct{})
			go func() {
				defer close(published)
				for i := 0; i < n; i++ {
					for {
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						_, err := p.Publish(ctx, s, []byte(strconv.Itoa(i)))
						cancel()
						if err == nil {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					if i%100 == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
			}()
			testenv.WaitFor(t, 30*time.Second, "a third of the entries", func() bool { _, got := rec.snapshot(); return got > n/3 })
			if kill {
				srv.Kill()
				time.Sleep(300 * time.Millisecond)
				srv.Start()
			} else {
				srv.Restart(300 * time.Millisecond)
			}
			<-published
			testenv.WaitFor(t, 60*time.Second, "every entry processed", func() bool {
				runs, _ := rec.snapshot()
				return len(runs) == n
			})
			runs, total := rec.snapshot()
			for i := range n {
				if runs[strconv.Itoa(i)] == 0 {
					t.Fatalf("entry %d lost", i)
				}
			}
			t.Logf("%d entries, %d handler runs (%d repeated after the restart)", n, total, total-n)
			testenv.WaitFor(t, 20*time.Second, "all acknowledged", func() bool { return pendingCount(t, rdb, s, g) == 0 })
		})
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	h := stream.HandlerFunc(func(context.Context, *stream.Message) error { return nil })
	tests := []struct {
		name string
		cfg  stream.Config
		want string
	}{
		{"no group", stream.Config{Streams: []string{"a"}}, "group is required"},
		{"no streams", stream.Config{Group: "g"}, "at least one stream"},
		{"duplicate stream", stream.Config{Group: "g", Streams: []string{"a", "a"}}, "listed twice"},
		{"dead-letter stream", stream.Config{Group: "g", Streams: []string{"a:dead"}}, "dead-letter stream"},
		{"negative concurrency", stream.Config{Group: "g", Streams: []string{"a"}, Concurrency: -1}, "concurrency"},
		{"tiny lease", stream.Config{Group: "g", Streams: []string{"a"}, Lease: time.Millisecond}, "lease"},
		{"bad start id", stream.Config{Group: "g", Streams: []string{"a"}, StartID: "x"}, "start id"},
		{"ok", stream.Config{Group: "g", Streams: []string{"a", "b"}, StartID: "$"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := stream.NewConsumer(rdb, tt.cfg, h)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// With fewer slots than streams, the readers take turns: a reader blocked
// on a quiet stream must not keep the only slot from the reader of a busy
// one.
func TestOneSlotServesEveryStream(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	quiet, _ := names()
	busy, g := names()
	rec := newRecorder(3)
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{quiet, busy}, Concurrency: 1, Block: 300 * time.Millisecond,
	}, rec))
	publish(t, rdb, busy, 3)
	select {
	case <-rec.done:
	case <-time.After(15 * time.Second):
		_, n := rec.snapshot()
		t.Fatalf("%d of 3 entries of the busy stream handled: its reader starved", n)
	}
}

// An entry whose handler returns Later is neither acknowledged nor
// dead-lettered, however often that happens: it comes back after the delay,
// its delivery count unchanged, until the handler is done with it.
func TestLaterRedeliversWithoutCountingDeliveries(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	const laters = 6 // more than MaxDeliveries
	var calls atomic.Int32
	var mu sync.Mutex
	var seen []int64
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		mu.Lock()
		seen = append(seen, msg.Deliveries)
		mu.Unlock()
		if calls.Add(1) <= laters {
			return stream.Later(10*time.Millisecond, errors.New("running elsewhere"))
		}
		return nil
	})
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 200 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		MaxDeliveries: 2, RetryBackoff: 10 * time.Millisecond,
	}, h))
	publish(t, rdb, s, 1)
	testenv.WaitFor(t, 30*time.Second, "the handler to finish the entry", func() bool { return calls.Load() == laters+1 })
	testenv.WaitFor(t, 5*time.Second, "ack", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	if dead := deadEntries(t, rdb, s); len(dead) != 0 {
		t.Errorf("%d dead letters, want none: %v", len(dead), dead)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, n := range seen {
		if n > 2 {
			t.Errorf("delivery %d counted as %d: Later must not count deliveries (all: %v)", i, n, seen)
		}
	}
}

// An entry that keeps coming back (stream.Later: a request waiting for a
// busy server) does not starve new entries of the only handler slot, even
// when another stream's reader takes turns for it: claiming and reading
// alternate when both are due.
func TestLaterDoesNotStarveNewEntries(t *testing.T) {
	rdb := testenv.Redis(t)
	s, g := names()
	quiet := testenv.Unique("test:stream:quiet:")
	var laters atomic.Int32
	handled := make(chan string, 16)
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		if string(msg.Data()) == "0" {
			laters.Add(1)
			return stream.Later(200*time.Millisecond, errors.New("server busy"))
		}
		handled <- string(msg.Data())
		return nil
	})
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s, quiet}, Concurrency: 1, Lease: 2 * time.Second, MaxDeliveries: 2,
	}, h))
	publish(t, rdb, s, 1)
	testenv.WaitFor(t, 30*time.Second, "the waiting entry to come back a few times", func() bool { return laters.Load() >= 3 })
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	if _, err := p.Publish(context.Background(), s, []byte("new")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-handled:
		if got != "new" {
			t.Fatalf("handled %q", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the new entry was not handled while another kept coming back (%d times)", laters.Load())
	}
}

// A free slot serves whichever stream has work at once: with one slot and
// four streams whose reads block long, an entry of the busy stream
// published after the last one's handler returned starts within a fraction
// of the block (readers per stream, each holding the slot through its
// blocking read in turn, took up to three blocks).
func TestFreeSlotServesBusyStreamAtOnce(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	busy, g := names()
	streams := []string{busy}
	for i := range 3 {
		streams = append(streams, fmt.Sprintf("%s:quiet%d", busy, i))
	}
	const block = 8 * time.Second
	type start struct {
		at     time.Time
		pickup time.Duration
	}
	started := make(chan start, 1)
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: streams, Concurrency: 1, Block: block, ClaimInterval: time.Minute,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		started <- start{time.Now(), msg.Pickup}
		return nil
	})))
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	for i := range 4 {
		sent := time.Now()
		if _, err := p.Publish(context.Background(), busy, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-started:
			wait := got.at.Sub(sent)
			if wait > block/4 {
				t.Fatalf("entry %d started %v after it was published, with a slot free (block %v)", i, wait, block)
			}
			// The entry's own measure of that wait (its id has milliseconds).
			if got.pickup <= 0 || got.pickup > wait+time.Millisecond {
				t.Errorf("entry %d: Message.Pickup %v, want in (0, %v]", i, got.pickup, wait+time.Millisecond)
			}
		case <-time.After(3 * block):
			t.Fatalf("entry %d not started", i)
		}
		time.Sleep(100 * time.Millisecond) // the slot is back and the reader blocked again
	}
}

// When one read returns more entries (several streams at once) than the
// reader holds slots, the others go back to the group at once, their
// delivery not counted, and run soon: every entry once, each on its first
// delivery.
func TestReadBeyondSlotsGivesBackUncounted(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	a, g := names()
	streams := []string{a, a + ":b", a + ":c"}
	ev := newEvents()
	var mu sync.Mutex
	runs := map[string][]int64{} // stream/id -> the delivery count of each run
	all := make(chan struct{})
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		mu.Lock()
		defer mu.Unlock()
		runs[msg.Stream+"/"+msg.ID] = append(runs[msg.Stream+"/"+msg.ID], msg.Deliveries)
		if len(runs) == 6 {
			close(all)
		}
		return nil
	})
	cons := newConsumer(t, rdb, stream.Config{
		Group: g, Streams: streams, Concurrency: 1, Lease: 2 * time.Second, Hook: ev.hook,
	}, h)
	// The groups exist before the entries, so the first read returns the
	// three streams' entries at once.
	var keys []string
	for _, s := range streams {
		if err := rdb.XGroupCreateMkStream(context.Background(), s, g, "$").Err(); err != nil {
			t.Fatal(err)
		}
		for _, id := range publish(t, rdb, s, 2) {
			keys = append(keys, s+"/"+id)
		}
	}
	running(t, cons)
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of 6 entries handled: %v", len(runs), runs)
	}
	for _, s := range streams {
		testenv.WaitFor(t, 10*time.Second, "acks", func() bool { return pendingCount(t, rdb, s, g) == 0 })
	}
	if n := ev.count(stream.EventReleased, ""); n == 0 {
		t.Error("no entry was given back: the read did not return several streams' entries at once")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		if got := runs[k]; !slices.Equal(got, []int64{1}) {
			t.Errorf("entry %s ran on deliveries %v, want once on the first: giving it back must not count", k, got)
		}
	}
}
