package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// While Redis falls behind, routine host results are dropped and counted;
// starts, failures and the end are kept, in order, and the stream expires.
func TestProgressDropsOnlyRoutineHostResults(t *testing.T) {
	rdb := testenv.Redis(t)
	jobID := testenv.Unique("job-")
	reg := prometheus.NewRegistry()
	h := &Handler{
		cfg: Config{ProgressTTL: time.Hour, ProgressMaxLen: 10_000},
		Deps: Deps{
			Producer: stream.NewProducer(rdb, stream.ProducerOptions{}),
			Metrics:  NewMetrics(reg),
			Clock:    clock.System(),
		},
	}
	entered, letGo := testenv.HoldFirstPipeline(rdb)
	defer letGo()
	p := h.startProgress(messages.JobKindProvision, jobID, zerolog.Nop())
	p.emit(messages.ProgressEvent{Type: messages.EventRunStarted})
	<-entered // the publisher waits in Redis with run_started
	for range progressBuffer {
		p.emit(messages.ProgressEvent{Type: messages.EventHostOK, Host: "h"})
	}
	// The buffer is full: routine results are dropped...
	p.emit(messages.ProgressEvent{Type: messages.EventHostChanged, Host: "h"})
	p.emit(messages.ProgressEvent{Type: messages.EventHostSkipped, Host: "h"})
	if got := testutil.ToFloat64(h.Metrics.progressDropped); got != 2 {
		t.Fatalf("dropped %v events, want 2", got)
	}
	// ...a failure waits for room instead.
	failed := make(chan struct{})
	go func() {
		p.emit(messages.ProgressEvent{Type: messages.EventHostFailed, Host: "h", Message: "boom"})
		close(failed)
	}()
	letGo()
	<-failed
	p.finish(messages.StatusFailed, "failed")

	msgs, err := rdb.XRange(context.Background(), messages.ProgressStream(messages.JobKindProvision, jobID), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + progressBuffer + 2; len(msgs) != want {
		t.Fatalf("%d events on the stream, want %d", len(msgs), want)
	}
	var evs []*messages.ProgressEvent
	for _, m := range msgs {
		ev, err := messages.DecodeProgressEvent([]byte(m.Values[messages.DataField].(string)))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	first, last := evs[0], evs[len(evs)-1]
	if first.Type != messages.EventRunStarted || first.Seq != 1 {
		t.Fatalf("first event %+v", first)
	}
	if f := evs[len(evs)-2]; f.Type != messages.EventHostFailed || f.Seq != int64(progressBuffer)+4 {
		t.Fatalf("failure event %+v, want seq %d (after the 2 dropped)", f, progressBuffer+4)
	}
	if last.Type != messages.EventRunFinished || last.Status != messages.StatusFailed || last.JobID != jobID {
		t.Fatalf("last event %+v", last)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Fatalf("event %d has seq %d after %d", i, evs[i].Seq, evs[i-1].Seq)
		}
	}
	if ttl := rdb.TTL(context.Background(), messages.ProgressStream(messages.JobKindProvision, jobID)).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("progress stream ttl %v, want up to an hour", ttl)
	}
	// Emitting after the end does nothing.
	p.emit(messages.ProgressEvent{Type: messages.EventTaskStarted})
	if n := rdb.XLen(context.Background(), messages.ProgressStream(messages.JobKindProvision, jobID)).Val(); n != int64(len(msgs)) {
		t.Fatalf("an event went out after the end: %d entries", n)
	}
}
