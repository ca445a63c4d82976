package stream_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
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
	started := os.Getenv("STREAM_TEST_STARTED")
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group:    os.Getenv("STREAM_TEST_GROUP"),
		Streams:  []string{os.Getenv("STREAM_TEST_STREAM")},
		Consumer: "child-" + strconv.Itoa(os.Getpid()),
		Lease:    lease,
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
	started := testenv.Unique("started-")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"STREAM_TEST_CHILD=consumer",
		"STREAM_TEST_REDIS="+redisURL,
		"STREAM_TEST_STREAM="+streamName,
		"STREAM_TEST_GROUP="+group,
		"STREAM_TEST_LEASE="+lease.String(),
		"STREAM_TEST_STARTED="+started,
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
	mu    sync.Mutex
	runs  map[string]int
	total int
	done  chan struct{}
	want  int
	fn    func(ctx context.Context, msg *stream.Message) error
}

func newRecorder(want int) *recorder {
	return &recorder{runs: map[string]int{}, done: make(chan struct{}), want: want}
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
	r.total++
	if r.total == r.want {
		close(r.done)
	}
	return nil
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
