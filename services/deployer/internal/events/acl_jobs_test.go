package events_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

// TestDeployerUserServesJobs: under the shipped ACL file the deployer's
// user publishes Ansible jobs (the default pool's stream and a pool's),
// reads job:results in its group, follows a job's events that infra wrote
// and sets the job's cancel key, which infra reads; a provisioning job's
// cancel key stays out of its reach.
func TestDeployerUserServesJobs(t *testing.T) {
	t.Parallel()
	_, rc := testenv.ACLRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dep, id := rc["deployer"], testenv.Unique("job-")
	for _, q := range []string{messages.AnsibleJobQueue(""), messages.AnsibleJobQueue("gpu")} {
		if err := dep.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: "x"}}).Err(); err != nil {
			t.Errorf("the deployer cannot publish on %s: %v", q, err)
		}
	}
	if err := rc["infra"].XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamJobResults, Values: map[string]any{messages.DataField: "r"}}).Err(); err != nil {
		t.Fatalf("infra cannot publish a job result: %v", err)
	}
	if err := dep.XGroupCreateMkStream(ctx, messages.StreamJobResults, "deployer", "0").Err(); err != nil {
		t.Fatalf("the deployer cannot make its group on job:results: %v", err)
	}
	got, err := dep.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "deployer", Consumer: "c1", Streams: []string{messages.StreamJobResults, ">"}, Count: 1, Block: -1}).Result()
	if err != nil || len(got) != 1 || len(got[0].Messages) != 1 {
		t.Fatalf("the deployer cannot read job:results: %v %v", got, err)
	}
	if err := dep.XAck(ctx, messages.StreamJobResults, "deployer", got[0].Messages[0].ID).Err(); err != nil {
		t.Errorf("the deployer cannot ack a job result: %v", err)
	}

	ev, err := messages.Encode(&messages.ProgressEvent{JobID: id, Seq: 1, Time: messages.FormatTime(time.Now()), Type: messages.EventRunStarted})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc["infra"].XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindJob, id),
		Values: map[string]any{messages.DataField: ev}}).Err(); err != nil {
		t.Fatalf("infra cannot publish a job's progress: %v", err)
	}
	hub := events.NewHub(stream.NewJobs(dep), events.HubConfig{Block: 50 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	sub, err := hub.SubscribeKind(ctx, messages.JobKindJob, id, "")
	if err != nil {
		t.Fatalf("the deployer cannot follow a job: %v", err)
	}
	if evs, _ := sub.Next(); len(evs) != 1 || evs[0].Type != string(messages.EventRunStarted) {
		t.Errorf("job events %+v", evs)
	}
	sub.Close()
	if err := dep.Set(ctx, messages.CancelKey(messages.JobKindJob, id), "deployer", time.Minute).Err(); err != nil {
		t.Fatalf("the deployer cannot cancel a job: %v", err)
	}
	if n, err := rc["infra"].Exists(ctx, messages.CancelKey(messages.JobKindJob, id)).Result(); err != nil || n != 1 {
		t.Errorf("infra does not see the job's cancel key: %d %v", n, err)
	}
	err = dep.Set(ctx, messages.CancelKey(messages.JobKindProvision, id), "1", time.Minute).Err()
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the deployer may set a provisioning job's cancel key: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
