package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestACLInfraServesJobPools: under the shipped ACL file, infra's user
// consumes the Ansible job queue and a pool's stream, dead-letters bad
// entries of both, publishes on job:results and the jobs' progress streams.
func TestACLInfraServesJobPools(t *testing.T) {
	_, rc := testenv.ACLRedis(t)
	ctx := context.Background()
	log := &lockedLog{}
	const jobQueue, poolQueue, jobResults = "ansible:job:queue", "ansible:job:queue:gpu", "job:results"
	infraProducer := stream.NewProducer(rc["infra"], stream.ProducerOptions{})
	done := make(chan string, 4)
	runConsumer(t, rc["infra"], "infra", []string{jobQueue, poolQueue}, log,
		stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
			if string(msg.Data()) == "poison" {
				return stream.Permanent("invalid_message", errors.New("bad input"))
			}
			events := progressStream("job", string(msg.Data()))
			if _, err := infraProducer.Publish(ctx, events, []byte("run_started")); err != nil {
				return err
			}
			if err := rc["infra"].Exists(ctx, cancelKey("job", string(msg.Data()))).Err(); err != nil {
				return err
			}
			if _, err := infraProducer.Publish(ctx, jobResults, msg.Data()); err != nil {
				return err
			}
			done <- msg.Stream
			return nil
		}))
	admin := stream.NewProducer(rc["admin"], stream.ProducerOptions{})
	for _, s := range []string{jobQueue, poolQueue} {
		for _, d := range []string{"poison", "job-" + s} {
			if _, err := admin.Publish(ctx, s, []byte(d)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("infra did not handle the jobs under its ACL:\n%s", log.String())
		}
	}
	testenv.WaitFor(t, 20*time.Second, "both poison entries dead-lettered", func() bool {
		a, _ := rc["admin"].XLen(ctx, jobQueue+stream.DeadLetterSuffix).Result()
		b, _ := rc["admin"].XLen(ctx, poolQueue+stream.DeadLetterSuffix).Result()
		return a == 1 && b == 1
	})
	if n, _ := rc["admin"].XLen(ctx, jobResults).Result(); n != 2 {
		t.Errorf("%d results, want 2", n)
	}
}
