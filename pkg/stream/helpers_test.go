package stream_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestMain doubles as a child process for the kill -9 tests: with
// STREAM_TEST_CHILD set, the test binary runs a consumer whose handler
// reports each entry it starts and then blocks forever.
func TestMain(m *testing.M) {
	if os.Getenv("STREAM_TEST_CHILD") == "consumer" {
		os.Exit(childConsumer())
	}
	os.Exit(m.Run())
}

func childConsumer() int {
	opt, err := redis.ParseURL(os.Getenv("STREAM_TEST_REDIS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(opt)
	lease, _ := time.ParseDuration(os.Getenv("STREAM_TEST_LEASE"))
	concurrency, _ := strconv.Atoi(os.Getenv("STREAM_TEST_CONCURRENCY"))
	prefetch, _ := strconv.Atoi(os.Getenv("STREAM_TEST_PREFETCH"))
	started := os.Getenv("STREAM_TEST_STARTED")
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group:       os.Getenv("STREAM_TEST_GROUP"),
		Streams:     []string{os.Getenv("STREAM_TEST_STREAM")},
		Consumer:    "child-" + strconv.Itoa(os.Getpid()),
		Lease:       lease,
		Concurrency: concurrency,
		Prefetch:    prefetch,
	}, stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		rdb.RPush(context.Background(), started, msg.ID)
		<-ctx.Done()
		return ctx.Err()
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = c.Run(context.Background()) // runs until killed
	return 0
}

// startChild starts a consumer process; entries it starts are pushed to the
// returned list key.
func startChild(t testing.TB, redisURL, streamName, group string, lease time.Duration) (*exec.Cmd, string) {
	t.Helper()
	return startChildWith(t, redisURL, streamName, group, lease, 0, 0)
}

// startChildWith is startChild with a concurrency and a prefetch (0: the
// defaults).
func startChildWith(t testing.TB, redisURL, streamName, group string, lease time.Duration, concurrency, prefetch int) (*exec.Cmd, string) {
	t.Helper()
	started := testenv.Unique("started-")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"STREAM_TEST_CHILD=consumer",
		"STREAM_TEST_REDIS="+redisURL,
		"STREAM_TEST_STREAM="+streamName,
		"STREAM_TEST_GROUP="+group,
		"STREAM_TEST_LEASE="+lease.String(),
		"STREAM_TEST_STARTED="+started,
		"STREAM_TEST_CONCURRENCY="+strconv.Itoa(concurrency),
		"STREAM_TEST_PREFETCH="+strconv.Itoa(prefetch),
	)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd, started
}

// names returns a fresh stream and group name.
func names() (string, string) {
	return testenv.Unique("test:stream:"), testenv.Unique("group-")
}

// publish appends n entries whose data is "0".."n-1" and returns their ids.
func publish(t testing.TB, rdb redis.UniversalClient, s string, n int) []string {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	data := make([][]byte, n)
	for i := range data {
		data[i] = []byte(strconv.Itoa(i))
	}
	var ids []string
	for len(data) > 0 {
		chunk := data[:min(len(data), 1000)]
		data = data[len(chunk):]
		got, err := p.PublishBatch(context.Background(), s, chunk)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// recorder is a handler that counts the runs of each payload.
type recorder struct {
	mu         sync.Mutex
	runs       map[string]int
	deliveries map[string]int64 // entry id -> delivery count of its last run
	total      int
	done       chan struct{}
	want       int
	fn         func(ctx context.Context, msg *stream.Message) error
}

func newRecorder(want int) *recorder {
	return &recorder{runs: map[string]int{}, deliveries: map[string]int64{}, done: make(chan struct{}), want: want}
}

func (r *recorder) Handle(ctx context.Context, msg *stream.Message) error {
	if r.fn != nil {
		if err := r.fn(ctx, msg); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[string(msg.Data())]++
	r.deliveries[msg.ID] = msg.Deliveries
	r.total++
	if r.total == r.want {
		close(r.done)
	}
	return nil
}

// delivery returns the delivery count of the last run of entry id (0: it
// did not run).
func (r *recorder) delivery(id string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deliveries[id]
}

// gate is a handler's wait for the test's go-ahead. open may be called
// more than once: tests defer it, so that a failing test leaves no handler
// hanging (deferred calls run before the cleanups that stop consumers).
func gate() (wait <-chan struct{}, open func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

func (r *recorder) snapshot() (map[string]int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.runs))
	for k, v := range r.runs {
		out[k] = v
	}
	return out, r.total
}

// running starts c and returns a stop function that cancels it and waits
// for Run to return.
func running(t testing.TB, c *stream.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("consumer Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Errorf("consumer did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newConsumer(t testing.TB, rdb redis.UniversalClient, cfg stream.Config, h stream.Handler) *stream.Consumer {
	t.Helper()
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	c, err := stream.NewConsumer(rdb, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pendingCount returns the group's pending entries count.
func pendingCount(t testing.TB, rdb redis.UniversalClient, s, g string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), s, g).Result()
	if noGroupYet(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// deadEntries returns the entries of s's dead-letter stream.
func deadEntries(t testing.TB, rdb redis.UniversalClient, s string) []redis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), s+stream.DeadLetterSuffix, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// events records what consumers report through Config.Hook, so that tests
// wait for what happened instead of sleeping.
type events struct {
	mu      sync.Mutex
	seen    []stream.Event
	changed chan struct{} // closed and replaced at each event
}

func newEvents() *events { return &events{changed: make(chan struct{})} }

// hook is a Config.Hook.
func (e *events) hook(ev stream.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, ev)
	close(e.changed)
	e.changed = make(chan struct{})
}

// count returns how many events of kind were seen for the entry id ("" for
// any entry).
func (e *events) count(kind stream.EventKind, id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.seen {
		if ev.Kind == kind && (id == "" || ev.ID == id) {
			n++
		}
	}
	return n
}

// wait waits until cond holds, re-checking it at each event; it fails the
// test after timeout, a bound far above what the condition needs.
func (e *events) wait(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !e.until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// until waits until cond holds, re-checking it at each event, and reports
// whether it did within timeout.
func (e *events) until(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

// waitCount waits until at least n events of kind were seen for id.
func (e *events) waitCount(t testing.TB, timeout time.Duration, kind stream.EventKind, id string, n int) {
	t.Helper()
	e.wait(t, timeout, fmt.Sprintf("%d %s events for %q", n, kind, id), func() bool { return e.count(kind, id) >= n })
}

// waitCountIn is waitCount for the entry id of stream st: entry ids are
// per stream, and entries appended to two streams in one millisecond get
// the same id.
func (e *events) waitCountIn(t testing.TB, timeout time.Duration, kind stream.EventKind, st, id string, n int) {
	t.Helper()
	e.wait(t, timeout, fmt.Sprintf("%d %s events for %q of %s", n, kind, id, st), func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		seen := 0
		for _, ev := range e.seen {
			if ev.Kind == kind && ev.Stream == st && ev.ID == id {
				seen++
			}
		}
		return seen >= n
	})
}

// pendingFor returns the ids of the entries pending for consumer in group g
// of s, oldest first.
func pendingFor(t testing.TB, rdb redis.UniversalClient, s, g, consumer string) []string {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: s, Group: g, Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if noGroupYet(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(p))
	for i, e := range p {
		ids[i] = e.ID
	}
	return ids
}

// noGroupYet reports whether err says the stream or its group does not exist
// yet: a consumer started by the test creates its group asynchronously, so a
// poll that runs first sees nothing pending rather than failing.
func noGroupYet(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}
