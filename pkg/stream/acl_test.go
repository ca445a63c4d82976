package stream_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The streams and keys of the system (pkg/messages names them; this
// package does not import it).
const (
	provisionerQueue   = "provisioner:queue"
	deployQueue        = "ansible:deploy:queue"
	provisionerResults = "provisioner:results"
	deployResults      = "deploy:results"
)

// progressStream and cancelKey name a job's progress stream and cancel key
// by the job's kind ("provision" or "deploy"), as messages.ProgressStream
// and messages.CancelKey do.
func progressStream(kind, jobID string) string { return "job:" + kind + ":" + jobID + ":events" }
func cancelKey(kind, jobID string) string      { return "job:" + kind + ":" + jobID + ":cancel" }

// lockedLog collects a zerolog output for inspection.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// runConsumer runs a consumer of group on streams for h until the test
// ends, logging into log.
func runConsumer(t *testing.T, rdb *redis.Client, group string, streams []string, log *lockedLog, h stream.Handler) {
	t.Helper()
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group: group, Streams: streams, Consumer: testenv.Unique("c-"),
		Lease: time.Second, MaxDeliveries: 2, RetryBackoff: 50 * time.Millisecond,
		Logger: zerolog.New(log),
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
}

func noPerm(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "can't access"))
}

// TestACLRolesInRealRedis runs the stream runtime of each role under the
// shipped ACL users in a real Redis: the scheduler and the deployer queue
// requests, infra consumes them (dead-lettering a poison one, publishing
// progress and results, reading a cancel key), and the requesters consume
// the results; no command of the runtime is refused. Then each role tries
// what it must not do, and is refused.
func TestACLRolesInRealRedis(t *testing.T) {
	_, rc := testenv.ACLRedis(t)
	ctx := context.Background()
	log := &lockedLog{}

	// infra: the shared record of passed SSH checks; no other service's.
	checkKey := "autoprov:infra:ssh-check:0123abcd"
	if err := rc["infra"].Set(ctx, checkKey, "1 proof", time.Minute).Err(); err != nil {
		t.Fatalf("infra cannot record a passed SSH check: %v", err)
	}
	if err := rc["infra"].Get(ctx, checkKey).Err(); err != nil {
		t.Fatalf("infra cannot read a passed SSH check: %v", err)
	}
	if err := rc["deployer"].Get(ctx, checkKey).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the deployer read infra's SSH check record: %v", err)
	}
	if err := rc["infra"].Del(ctx, checkKey).Err(); err != nil {
		t.Fatalf("infra cannot forget a passed SSH check: %v", err)
	}

	// infra: one consumer group on both request streams.
	infraProducer := stream.NewProducer(rc["infra"], stream.ProducerOptions{})
	runConsumer(t, rc["infra"], "infra", []string{provisionerQueue, deployQueue}, log,
		stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
			switch string(msg.Data()) {
			case "poison":
				return stream.Permanent("invalid_message", errors.New("bad input"))
			case "slow": // outlives half its lease: the heartbeat renews it
				time.Sleep(1500 * time.Millisecond)
			case "flaky": // fails once: redelivered after a backoff
				if msg.Deliveries == 1 {
					return errors.New("transient")
				}
			}
			kind, results := "provision", provisionerResults
			if msg.Stream == deployQueue {
				kind, results = "deploy", deployResults
			}
			events := progressStream(kind, string(msg.Data()))
			if _, err := infraProducer.Publish(ctx, events, []byte("run_started")); err != nil {
				return err
			}
			if err := rc["infra"].Expire(ctx, events, time.Hour).Err(); err != nil {
				return err
			}
			if err := rc["infra"].Exists(ctx, cancelKey(kind, string(msg.Data()))).Err(); err != nil {
				return err
			}
			_, err := infraProducer.Publish(ctx, results, append([]byte("result of "), msg.Data()...))
			return err
		}))

	got := make(chan string, 10)
	collect := stream.HandlerFunc(func(_ context.Context, msg *stream.Message) error {
		got <- msg.Stream + " " + string(msg.Data())
		return nil
	})
	runConsumer(t, rc["scheduler"], "scheduler", []string{provisionerResults}, log, collect)
	runConsumer(t, rc["deployer"], "deployer", []string{deployResults}, log, collect)

	if _, err := stream.NewProducer(rc["scheduler"], stream.ProducerOptions{}).Publish(ctx, provisionerQueue, []byte("prov-1")); err != nil {
		t.Fatalf("scheduler cannot queue a provisioning request: %v", err)
	}
	for _, d := range []string{"poison", "slow", "flaky"} {
		if _, err := stream.NewProducer(rc["scheduler"], stream.ProducerOptions{}).Publish(ctx, provisionerQueue, []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	// The deployer's observer follows the request queue.
	observed := make(chan string, 10)
	tail, err := stream.NewTail(rc["deployer"], stream.TailConfig{Stream: deployQueue, From: "0", Block: 100 * time.Millisecond},
		func(_ context.Context, msgs []*stream.Message) error {
			for _, m := range msgs {
				observed <- string(m.Data())
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	tctx, stopTail := context.WithCancel(ctx)
	tailDone := make(chan error, 1)
	go func() { tailDone <- tail.Run(tctx) }()
	defer func() { stopTail(); <-tailDone }()
	if _, err := stream.NewProducer(rc["deployer"], stream.ProducerOptions{}).Publish(ctx, deployQueue, []byte("deploy-1")); err != nil {
		t.Fatalf("deployer cannot queue a deploy: %v", err)
	}
	if err := rc["deployer"].Set(ctx, cancelKey("deploy", "deploy-1"), "1", time.Minute).Err(); err != nil {
		t.Fatalf("deployer cannot cancel: %v", err)
	}
	want := map[string]bool{provisionerResults + " result of prov-1": true, deployResults + " result of deploy-1": true,
		provisionerResults + " result of slow": true, provisionerResults + " result of flaky": true}
	for len(want) > 0 {
		select {
		case g := <-got:
			if !want[g] {
				t.Fatalf("unexpected result %q", g)
			}
			delete(want, g)
		case <-time.After(30 * time.Second):
			t.Fatalf("results missing: %v\nlog:\n%s", want, log.String())
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the poison request dead-lettered", func() bool {
		n, _ := rc["admin"].XLen(ctx, provisionerQueue+stream.DeadLetterSuffix).Result()
		return n == 1
	})
	// The deployer observes the request queue read-only (OBSERVE_QUEUE).
	select {
	case d := <-observed:
		if d != "deploy-1" {
			t.Errorf("the observer read %q, want deploy-1", d)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the deployer's observer did not see deploy-1:\n%s", log.String())
	}
	// (The entry itself may be gone: infra's consumer trims what its group
	// acknowledged, at its start too, which under load can come after it.)
	if xs, err := rc["deployer"].XRevRangeN(ctx, deployQueue, "+", "-", 1).Result(); err != nil {
		t.Errorf("deployer reads the queue's newest entry (where its observer starts): %v %v", xs, err)
	}
	// The requesters follow the progress of their own kind of job.
	for u, events := range map[string]string{"scheduler": progressStream("provision", "prov-1"), "deployer": progressStream("deploy", "deploy-1")} {
		if evs, err := rc[u].XRange(ctx, events, "-", "+").Result(); err != nil || len(evs) != 1 {
			t.Errorf("%s reads progress: %v %v", u, evs, err)
		}
	}
	// The deployer's console follows a provisioning run's progress, read-only.
	if evs, err := rc["deployer"].XRange(ctx, progressStream("provision", "prov-1"), "-", "+").Result(); err != nil || len(evs) != 1 {
		t.Errorf("deployer reads a provisioning run's progress: %v %v", evs, err)
	}
	if err := rc["deployer"].XRead(ctx, &redis.XReadArgs{Streams: []string{progressStream("provision", "prov-1"), "0"}, Block: -1}).Err(); err != nil {
		t.Errorf("deployer follows a provisioning run's progress: %v", err)
	}
	if strings.Contains(log.String(), "NOPERM") || strings.Contains(log.String(), "can't access") {
		t.Fatalf("the stream runtime ran a command its role may not:\n%s", log.String())
	}

	// What each role must not do.
	forbidden := map[string][]func() error{
		"infra": {
			func() error {
				return rc["infra"].XAdd(ctx, &redis.XAddArgs{Stream: provisionerQueue, Values: map[string]any{"data": "x"}}).Err()
			},
			func() error {
				return rc["infra"].XAdd(ctx, &redis.XAddArgs{Stream: deployQueue, Values: map[string]any{"data": "x"}}).Err()
			},
			func() error {
				return rc["infra"].Eval(ctx, "return redis.call('XADD', KEYS[1], '*', 'data', 'x')", []string{provisionerQueue}).Err()
			},
			func() error {
				return rc["infra"].Eval(ctx, "return redis.call('XADD', 'ansible:deploy:queue', '*', 'd', 'x')", nil).Err()
			},
			func() error { return rc["infra"].Set(ctx, cancelKey("deploy", "x"), "1", 0).Err() },
			func() error { return rc["infra"].Del(ctx, provisionerResults).Err() },
			func() error { return rc["infra"].Expire(ctx, provisionerResults, time.Second).Err() },
			func() error { return rc["infra"].Keys(ctx, "*").Err() },
			func() error { return rc["infra"].ConfigGet(ctx, "*").Err() },
			func() error { return rc["infra"].FlushAll(ctx).Err() },
		},
		"scheduler": {
			func() error {
				return rc["scheduler"].XAdd(ctx, &redis.XAddArgs{Stream: deployQueue, Values: map[string]any{"data": "x"}}).Err()
			},
			func() error {
				return rc["scheduler"].XAdd(ctx, &redis.XAddArgs{Stream: provisionerResults, Values: map[string]any{"data": "forged"}}).Err()
			},
			func() error {
				return rc["scheduler"].XAdd(ctx, &redis.XAddArgs{Stream: progressStream("provision", "x"), Values: map[string]any{"data": "x"}}).Err()
			},
			// Of deploys it follows nothing, and it cancels nothing.
			func() error { return rc["scheduler"].XRange(ctx, progressStream("deploy", "deploy-1"), "-", "+").Err() },
			func() error {
				return rc["scheduler"].XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: "thief",
					Streams: []string{provisionerQueue, ">"}, Count: 1, Block: -1}).Err()
			},
			func() error { return rc["scheduler"].XRange(ctx, provisionerQueue, "-", "+").Err() },
			func() error { return rc["scheduler"].Set(ctx, cancelKey("provision", "x"), "1", 0).Err() },
			func() error { return rc["scheduler"].Set(ctx, cancelKey("deploy", "x"), "1", 0).Err() },
		},
		"deployer": {
			func() error {
				return rc["deployer"].XAdd(ctx, &redis.XAddArgs{Stream: provisionerQueue, Values: map[string]any{"data": "x"}}).Err()
			},
			func() error {
				return rc["deployer"].XAdd(ctx, &redis.XAddArgs{Stream: deployResults, Values: map[string]any{"data": "forged"}}).Err()
			},
			func() error {
				return rc["deployer"].XAdd(ctx, &redis.XAddArgs{Stream: progressStream("deploy", "x"), Values: map[string]any{"data": "x"}}).Err()
			},
			// A provisioning job's progress it reads but may not write; its
			// cancel key is out of its reach, as are the names of before
			// the kinds (job:<id>:events, job:<id>:cancel).
			func() error {
				return rc["deployer"].XAdd(ctx, &redis.XAddArgs{Stream: progressStream("provision", "prov-1"), Values: map[string]any{"data": "forged"}}).Err()
			},
			func() error {
				return rc["deployer"].Expire(ctx, progressStream("provision", "prov-1"), time.Second).Err()
			},
			func() error { return rc["deployer"].Del(ctx, progressStream("provision", "prov-1")).Err() },
			func() error { return rc["deployer"].Set(ctx, cancelKey("provision", "prov-1"), "1", time.Minute).Err() },
			func() error { return rc["deployer"].Exists(ctx, cancelKey("provision", "prov-1")).Err() },
			func() error { return rc["deployer"].Set(ctx, "job:prov-1:cancel", "1", time.Minute).Err() },
			func() error { return rc["deployer"].XRange(ctx, "job:prov-1:events", "-", "+").Err() },
			func() error {
				return rc["deployer"].XReadGroup(ctx, &redis.XReadGroupArgs{Group: "infra", Consumer: "thief",
					Streams: []string{deployQueue, ">"}, Count: 1, Block: -1}).Err()
			},
			// It observes the request queue read-only: it may not take,
			// acknowledge, delete or trim infra's requests, nor open a
			// consumer group there that would hold back infra's trimming.
			func() error { return rc["deployer"].XAck(ctx, deployQueue, "infra", "0-1").Err() },
			func() error { return rc["deployer"].XDel(ctx, deployQueue, "0-1").Err() },
			func() error { return rc["deployer"].XTrimMaxLen(ctx, deployQueue, 0).Err() },
			func() error { return rc["deployer"].XGroupCreateMkStream(ctx, deployQueue, "deployer", "$").Err() },
			func() error { return rc["deployer"].XRange(ctx, provisionerQueue, "-", "+").Err() },
		},
	}
	for role, tries := range forbidden {
		for i, try := range tries {
			if err := try(); !noPerm(err) {
				t.Errorf("%s, forbidden command %d: err = %v, want a refusal by the ACL", role, i, err)
			}
		}
	}
	// Without a user nothing works: the default user is off.
	anon := redis.NewClient(&redis.Options{Addr: rc["admin"].Options().Addr})
	defer anon.Close()
	if err := anon.XAdd(ctx, &redis.XAddArgs{Stream: provisionerQueue, Values: map[string]any{"data": "x"}}).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("anonymous XADD: %v, want NOAUTH", err)
	}
}
