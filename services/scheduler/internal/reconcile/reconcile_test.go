package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/reconcile"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/results"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/rules"
)

// TestRetryBackoffExhaustionAndDuplicates runs the loop, the relay and the
// results consumer against real Postgres and Redis, with the test playing
// infra: a server that keeps failing is retried after each backoff, then
// stays FAILED; redelivered and stale results change nothing.
func TestRetryBackoffExhaustionAndDuplicates(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	rdb := redis.NewClient(mustOpt(t, testenv.RedisDB(t)))
	clk := clocktest.NewFake(time.Now())
	f := fleet.New(db, fleet.Options{Now: clk.Now})
	log := zerolog.Nop()
	handler := results.New(f, nil, results.Policy{RetryLimit: 3, Backoff: time.Minute, MaxBackoff: time.Hour}, log, nil)
	relay := reconcile.NewRelay(f, stream.NewProducer(rdb, stream.ProducerOptions{}), reconcile.RelayConfig{})
	loop := reconcile.New(f, nil, nil, handler, reconcile.Config{})
	consumer, err := stream.NewConsumer(rdb, stream.Config{Group: results.Group, Streams: []string{messages.StreamProvisionerResults},
		Block: 100 * time.Millisecond}, handler)
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = consumer.Run(cctx); close(done) }()
	defer func() { stopConsumer(); <-done }()

	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('s1', '192.0.2.1')`); err != nil {
		t.Fatal(err)
	}
	lastID := "0"
	// tick queues and relays; returns the job published for s1, if any.
	tick := func() *messages.ProvisionerMessage {
		t.Helper()
		if _, err := loop.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "("+lastID, "+").Result()
		if lastID == "0" {
			entries, err = rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			return nil
		}
		if len(entries) > 1 {
			t.Fatalf("%d messages published in one tick for one server", len(entries))
		}
		lastID = entries[0].ID
		m, err := messages.DecodeProvisionerMessage([]byte(entries[0].Values[messages.DataField].(string)))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	publish := func(m *messages.ProvisionerMessage, st messages.Status) {
		t.Helper()
		res := messages.NewProvisionerResult(m, "1-0")
		if st == messages.StatusSucceeded {
			res.Succeed()
		} else {
			res.Fail(st, messages.KindPlaybookFailed, "task failed")
		}
		data, _ := messages.Encode(res)
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerResults, Values: map[string]any{"data": data}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	get := func() *fleet.Server {
		s, err := f.Get(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitAttempts := func(n int, status string) {
		t.Helper()
		testenv.WaitFor(t, time.Minute, fmt.Sprintf("attempts %d, %s", n, status), func() bool {
			s := get()
			return s.Attempts == n && s.Status == status && s.PendingJobID == ""
		})
	}

	m1 := tick()
	if m1 == nil || m1.ServerHandle != "s1" || m1.IsRecovery || m1.ForceReinstall {
		t.Fatalf("first message %+v", m1)
	}
	if s := get(); s.Status != fleet.StatusProvisioning {
		t.Fatalf("after relay: %s", s.Status)
	}
	if m := tick(); m != nil {
		t.Fatal("a second message while a job is in flight")
	}
	publish(m1, messages.StatusFailed)
	publish(m1, messages.StatusFailed) // redelivered: no second attempt counted
	waitAttempts(1, fleet.StatusFailed)
	if m := tick(); m != nil {
		t.Fatal("retried before the backoff")
	}
	clk.Advance(time.Minute)
	m2 := tick()
	if m2 == nil || m2.JobID == m1.JobID {
		t.Fatalf("retry after 1m: %+v", m2)
	}
	foreign := *m2
	foreign.JobID = "someone-elses-job" // a job the scheduler never queued: stale
	publish(&foreign, messages.StatusSucceeded)
	publish(m1, messages.StatusSucceeded) // a late result of a finished job: duplicate
	publish(m2, messages.StatusFailed)
	waitAttempts(2, fleet.StatusFailed)
	clk.Advance(time.Minute) // the second backoff is 2m
	if m := tick(); m != nil {
		t.Fatal("retried before the doubled backoff")
	}
	clk.Advance(time.Minute)
	m3 := tick()
	if m3 == nil {
		t.Fatal("no third attempt")
	}
	publish(m3, messages.StatusFailed)
	waitAttempts(3, fleet.StatusFailed)
	if s := get(); !s.RetriesExhausted {
		t.Errorf("retries not exhausted: %+v", s)
	}
	clk.Advance(24 * time.Hour)
	if m := tick(); m != nil {
		t.Fatal("an exhausted server was retried")
	}
	var stale, notes int
	_ = db.QueryRow(ctx, `SELECT count(*) FROM server_history WHERE event = 'stale_result' AND job_id = 'someone-elses-job'`).Scan(&stale)
	_ = db.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE handle = 's1'`).Scan(&notes)
	if stale != 1 || notes != 1 {
		t.Errorf("stale results recorded %d (want 1), notifications %d (want 1: retries exhausted)", stale, notes)
	}
}

// TestStuckJobs: a job whose message was lost is handed over again with the
// same job id; a job whose result was lost gets the stored result applied.
func TestStuckJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	rdb := redis.NewClient(mustOpt(t, testenv.RedisDB(t)))
	clk := clocktest.NewFake(time.Now())
	f := fleet.New(db, fleet.Options{Now: clk.Now})
	handler := results.New(f, nil, results.Policy{}, zerolog.Nop(), nil)
	relay := reconcile.NewRelay(f, stream.NewProducer(rdb, stream.ProducerOptions{}), reconcile.RelayConfig{})
	loop := reconcile.New(f, nil, nil, handler, reconcile.Config{StuckAfter: time.Hour})
	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('lost', '192.0.2.1'), ('done', '192.0.2.2')`); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	done, _ := f.Get(ctx, "done")
	lost, _ := f.Get(ctx, "lost")
	// Redis lost everything (a restart without persistence); infra had
	// finished "done" and stored its result.
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res := &messages.ProvisionerResult{Outcome: messages.Outcome{JobID: done.PendingJobID, RequestID: "1-0", Status: messages.StatusSucceeded}, ServerHandle: "done"}
	data, _ := messages.Encode(res)
	if _, err := db.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, state, status, result, finished_at)
		VALUES ($1, 'provision', 'provisioner:queue', '1-0', 'done', 'done', 'done', 'succeeded', $2, now())`, done.PendingJobID, data); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	rep, err := loop.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requeued != 1 || rep.Mended != 1 {
		t.Errorf("tick: %+v", rep)
	}
	if s, _ := f.Get(ctx, "done"); s.Status != fleet.StatusReady {
		t.Errorf("done: %s", s.Status)
	}
	if _, err := relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	entries, _ := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
	if len(entries) != 1 {
		t.Fatalf("%d messages after the requeue", len(entries))
	}
	m, _ := messages.DecodeProvisionerMessage([]byte(entries[0].Values["data"].(string)))
	if m.JobID != lost.PendingJobID || m.ServerHandle != "lost" {
		t.Errorf("requeued %+v, want job %s", m, lost.PendingJobID)
	}
}

func mustOpt(t *testing.T, url string) *redis.Options {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestMessagesCarryTheRulesPlaybooks: each queued message names the extra
// playbooks of the rules that match its server, in the rules file's order,
// for every action; a server no rule gives playbooks gets none.
func TestMessagesCarryTheRulesPlaybooks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	rdb := redis.NewClient(mustOpt(t, testenv.RedisDB(t)))
	set, err := rules.Parse("rules.yml", []byte(`
rules:
  - name: monitoring everywhere but dev
    match:
      all: [{label: env, equals: prod}]
    playbooks: [monitoring.yml]
  - name: web
    match:
      any: [{group: web}, {group: edge}]
    playbooks: [nginx.yml, monitoring.yml, app.yaml]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	f := fleet.New(db, fleet.Options{})
	relay := reconcile.NewRelay(f, stream.NewProducer(rdb, stream.ProducerOptions{}), reconcile.RelayConfig{})
	loop := reconcile.New(f, nil, func() *rules.Set { return set }, results.New(f, nil, results.Policy{}, zerolog.Nop(), nil), reconcile.Config{})
	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address, labels) VALUES
		('web-prod', '192.0.2.1', '{"group:web": "", "env": "prod"}'),
		('edge-dev', '192.0.2.2', '{"group:edge": "", "env": "dev"}'),
		('db-prod', '192.0.2.3', '{"group:db": "", "env": "prod"}'),
		('plain', '192.0.2.4', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RequestAction(ctx, "db-prod", fleet.ActionRecovery, "test", "check"); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*messages.ProvisionerMessage{}
	for _, e := range entries {
		m, err := messages.DecodeProvisionerMessage([]byte(e.Values[messages.DataField].(string)))
		if err != nil {
			t.Fatal(err)
		}
		got[m.ServerHandle] = m
	}
	want := map[string][]string{
		"web-prod": {"monitoring.yml", "nginx.yml", "app.yaml"},
		"edge-dev": {"nginx.yml", "monitoring.yml", "app.yaml"},
		"db-prod":  {"monitoring.yml"},
		"plain":    nil,
	}
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for handle, pbs := range want {
		m := got[handle]
		if m == nil || !slices.Equal(m.Playbooks, pbs) {
			t.Errorf("%s: message %+v, want playbooks %v", handle, m, pbs)
		}
	}
	if !got["db-prod"].IsRecovery {
		t.Errorf("db-prod: recovery asked for, message %+v", got["db-prod"])
	}
}
