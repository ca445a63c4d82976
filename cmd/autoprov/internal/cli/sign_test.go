package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

const (
	cliKey       = "autoprov-cli-signing-key-0123456789abcdef-012345"
	schedulerKey = "scheduler-signing-key-0123456789abcdef-0123456789"
)

// TestSignedRequests: with REQUEST_SIGNING_KEY_ID and REQUEST_SIGNING_KEY
// set, `autoprov provision` signs its request; `autoprov dead replay`
// keeps the producer's data and signature, and replaces them with a new
// job id under its own signature only with --resign, once the operator
// answered y; the key is never printed.
func TestSignedRequests(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	ctx := context.Background()
	signed := map[string]string{"REDIS_URL": url, "REQUEST_SIGNING_KEY_ID": "autoprov-1", "REQUEST_SIGNING_KEY": cliKey}
	v, err := messages.NewVerifier(
		messages.VerifierKey{ID: "autoprov-1", Key: []byte(cliKey), Streams: []string{messages.StreamProvisionerQueue}},
		messages.VerifierKey{ID: "scheduler-1", Key: []byte(schedulerKey), Streams: []string{messages.StreamProvisionerQueue}},
	)
	if err != nil {
		t.Fatal(err)
	}
	verify := func(e redis.XMessage) (string, error) {
		data, _ := e.Values[messages.DataField].(string)
		sig, _ := e.Values[stream.SigField].(string)
		return v.Verify(messages.StreamProvisionerQueue, []byte(data), sig)
	}

	out, errOut, code := run(t, signed, "provision", "web-1", "--job-id", "job-signed")
	if code != 0 {
		t.Fatalf("provision: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, cliKey) {
		t.Fatal("the signing key was printed")
	}
	entries, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %d entries, %v", len(entries), err)
	}
	if id, err := verify(entries[0]); err != nil || id != "autoprov-1" {
		t.Fatalf("the provision request's signature: %q, %v", id, err)
	}

	// A request the scheduler signed dies; replayed with a new job id, it
	// carries autoprov's signature (or, without a key, none).
	rdb.Del(ctx, messages.StreamProvisionerQueue)
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group: "infra", Streams: []string{messages.StreamProvisionerQueue}, Consumer: "infra-test",
		Block: 100 * time.Millisecond, StartID: "0",
	}, stream.HandlerFunc(func(_ context.Context, m *stream.Message) error {
		if m.Values[stream.ReplayFieldDeadID] != nil {
			return nil // the replayed requests are taken
		}
		return stream.Permanent("rejected", errFake("server web-9 is not registered"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	defer func() { cancel(); <-done }()
	for _, job := range []string{"job-dead-1", "job-dead-2"} {
		data := provisionRequest(t, job, "web-9")
		sig, err := messages.Sign("scheduler-1", []byte(schedulerKey), messages.StreamProvisionerQueue, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamProvisionerQueue,
			Values: map[string]any{messages.DataField: data, stream.SigField: sig}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	deadStream := messages.StreamProvisionerQueue + stream.DeadLetterSuffix
	var dead []redis.XMessage
	for range 1500 {
		if dead, _ = rdb.XRange(ctx, deadStream, "-", "+").Result(); len(dead) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	for _, d := range dead {
		if d.Values[stream.SigField] == nil {
			t.Fatalf("dead letter %s lost its producer's signature: %v", d.ID, d.Values)
		}
	}

	replay := func(deadID string, stdin io.Reader, args ...string) (redis.XMessage, string) {
		t.Helper()
		out, errOut, code := runStdin(t, signed, stdin, append([]string{"--json", "dead", "replay", messages.StreamProvisionerQueue, deadID}, args...)...)
		if code != 0 {
			t.Fatalf("dead replay: exit %d: %s", code, errOut)
		}
		var r struct {
			NewID string `json:"new_id"`
			JobID string `json:"job_id"`
		}
		mustJSON(t, out, &r)
		if strings.Contains(out+errOut, cliKey) {
			t.Fatal("the signing key was printed")
		}
		e, err := rdb.XRange(ctx, messages.StreamProvisionerQueue, r.NewID, r.NewID).Result()
		if err != nil || len(e) != 1 {
			t.Fatalf("replayed entry %s: %v", r.NewID, err)
		}
		return e[0], r.JobID
	}
	// A plain replay: the scheduler's data and signature, as they were.
	// (The consumer may dead-letter the two in either order.)
	first, err := messages.DecodeProvisionerMessage([]byte(dead[0].Values[messages.DataField].(string)))
	if err != nil {
		t.Fatal(err)
	}
	e, job := replay(dead[0].ID, nil)
	if id, err := verify(e); err != nil || id != "scheduler-1" || job != first.JobID ||
		e.Values[messages.DataField] != dead[0].Values[messages.DataField] || e.Values[stream.SigField] != dead[0].Values[stream.SigField] {
		t.Errorf("plain replay: job %s, signature %q, %v; want the scheduler's request unchanged", job, id, err)
	}
	// --resign, answered y: a new job id under autoprov's signature.
	e, job = replay(dead[1].ID, strings.NewReader("y\n"), "--resign")
	if id, err := verify(e); err != nil || id != "autoprov-1" || job == "" || strings.HasPrefix(job, "job-dead") {
		t.Errorf("re-signed replay: job %s, signature %q, %v; want a new job under autoprov-1's", job, id, err)
	}
	if req, err := messages.DecodeProvisionerMessage([]byte(e.Values[messages.DataField].(string))); err != nil || req.JobID != job {
		t.Errorf("re-signed replay carries %+v (%v), want job %s", req, err, job)
	}
}
