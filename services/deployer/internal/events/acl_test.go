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

// TestDeployerUserReachesOnlyDeploys runs the hub as the deployer's ACL
// user of the shipped ACL file: it follows a deploy's events, which infra
// writes as its own user, and the deployer may set that deploy's cancel
// key; a provisioning job's events it may read (the console's run page)
// but not write, and its cancel key (and the names of before the kinds,
// job:<id>:...) are refused, so a deployer cannot cancel what the
// scheduler asked for.
func TestDeployerUserReachesOnlyDeploys(t *testing.T) {
	t.Parallel()
	_, rc := testenv.ACLRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deploy, provision := testenv.Unique("dep-"), testenv.Unique("prov-")

	publish := func(kind messages.JobKind, id string, seq int64, typ messages.EventType) {
		t.Helper()
		ev := &messages.ProgressEvent{JobID: id, Seq: seq, Time: messages.FormatTime(time.Now()), Type: typ}
		if typ == messages.EventRunFinished {
			ev.Status = messages.StatusSucceeded
		}
		data, err := messages.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := rc["infra"].XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(kind, id),
			Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
			t.Fatalf("infra cannot publish %s progress: %v", kind, err)
		}
	}
	publish(messages.JobKindDeploy, deploy, 1, messages.EventRunStarted)
	publish(messages.JobKindProvision, provision, 1, messages.EventRunStarted)

	hub := events.NewHub(stream.NewJobs(rc["deployer"]), events.HubConfig{Block: 50 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	sub, err := hub.Subscribe(ctx, deploy, "")
	if err != nil {
		t.Fatalf("the deployer cannot follow a deploy: %v", err)
	}
	defer sub.Close()
	publish(messages.JobKindDeploy, deploy, 2, messages.EventRunFinished)
	var got []string
	deadline := time.After(30 * time.Second)
	for len(got) < 2 {
		evs, more := sub.Next()
		for _, ev := range evs {
			got = append(got, ev.Type)
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-more:
		case <-deadline:
			t.Fatalf("events %v, want run_started and run_finished", got)
		}
	}
	if strings.Join(got, ",") != "run_started,run_finished" {
		t.Errorf("events %v", got)
	}
	// Its own kind's cancel key works, as DELETE /deployments/{id} uses it;
	// infra reads it.
	if err := rc["deployer"].Set(ctx, messages.CancelKey(messages.JobKindDeploy, deploy), "deployer", time.Minute).Err(); err != nil {
		t.Fatalf("the deployer cannot cancel a deploy: %v", err)
	}
	if n, err := rc["infra"].Exists(ctx, messages.CancelKey(messages.JobKindDeploy, deploy)).Result(); err != nil || n != 1 {
		t.Fatalf("infra does not see the deploy's cancel key: %d %v", n, err)
	}

	// A provisioning job's events it reads (the console's run page), and
	// no more.
	if evs, err := rc["deployer"].XRange(ctx, messages.ProgressStream(messages.JobKindProvision, provision), "-", "+").Result(); err != nil || len(evs) != 1 {
		t.Fatalf("the deployer cannot read a provisioning job's events: %v %v", evs, err)
	}
	if err := rc["deployer"].XRead(ctx, &redis.XReadArgs{
		Streams: []string{messages.ProgressStream(messages.JobKindProvision, provision), "0"}, Block: -1}).Err(); err != nil {
		t.Fatalf("the deployer cannot follow a provisioning job's events: %v", err)
	}

	refused := map[string]func() error{
		"set a provisioning job's cancel key": func() error {
			return rc["deployer"].Set(ctx, messages.CancelKey(messages.JobKindProvision, provision), "1", time.Minute).Err()
		},
		"write a provisioning job's events": func() error {
			return rc["deployer"].XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindProvision, provision),
				Values: map[string]any{messages.DataField: "forged"}}).Err()
		},
		"write a provisioning job's events from a script": func() error {
			return rc["deployer"].Eval(ctx, "return redis.call('XADD', ARGV[1], '*', 'data', 'x')", nil,
				messages.ProgressStream(messages.JobKindProvision, provision)).Err()
		},
		"set a provisioning job's cancel key from a script": func() error {
			return rc["deployer"].Eval(ctx, "return redis.call('SET', KEYS[1], '1')",
				[]string{messages.CancelKey(messages.JobKindProvision, provision)}).Err()
		},
		"set a provisioning job's cancel key from a script naming no key": func() error {
			return rc["deployer"].Eval(ctx, "return redis.call('SET', ARGV[1], '1')", nil,
				messages.CancelKey(messages.JobKindProvision, provision)).Err()
		},
		"set a cancel key of the names without kind": func() error {
			return rc["deployer"].Set(ctx, "job:"+provision+":cancel", "1", time.Minute).Err()
		},
		"read events of the names without kind": func() error {
			return rc["deployer"].XRange(ctx, "job:"+provision+":events", "-", "+").Err()
		},
	}
	for what, try := range refused {
		// A script's command on a key the user may not reach is refused
		// with its own words.
		if err := try(); err == nil || (!strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't access")) {
			t.Errorf("the deployer's Redis user may %s: err = %v, want NOPERM", what, err)
		}
	}
	if n, err := rc["admin"].Exists(ctx, messages.CancelKey(messages.JobKindProvision, provision), "job:"+provision+":cancel").Result(); err != nil || n != 0 {
		t.Errorf("a provisioning job's cancel key was set (%d, %v)", n, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
