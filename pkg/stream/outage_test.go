package stream_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// A producer with OutageWait publishes through a Redis restart: the XADD
// made while Redis is down lands once Redis is back, instead of failing
// (a job's result must not be lost to a Redis restart). Without
// OutageWait it fails at once, as before.
func TestPublishWaitsOutRedisOutage(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	rdb := srv.Client()
	ctx := context.Background()
	s, _ := names()

	srv.Kill()
	if _, err := stream.NewProducer(rdb, stream.ProducerOptions{}).Publish(ctx, s, []byte("x")); err == nil {
		t.Fatal("publish without OutageWait succeeded while Redis was down")
	}

	type res struct {
		id  string
		err error
	}
	done := make(chan res, 1)
	go func() {
		id, err := stream.NewProducer(rdb, stream.ProducerOptions{OutageWait: time.Minute}).Publish(ctx, s, []byte("result"))
		done <- res{id, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("publish returned while Redis was down: %+v", r)
	case <-time.After(2 * time.Second):
	}
	srv.Start()
	var r res
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("publish did not return after Redis came back")
	}
	if r.err != nil {
		t.Fatalf("publish through the outage: %v", r.err)
	}
	msgs, err := rdb.XRange(ctx, s, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].ID != r.id || msgs[0].Values[stream.DataField] != "result" {
		t.Fatalf("stream = %+v, want the one entry %s", msgs, r.id)
	}
}

// The wait is bounded: past OutageWait the error is returned.
func TestPublishOutageWaitIsBounded(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	rdb := srv.Client()
	s, _ := names()
	srv.Kill()
	start := time.Now()
	_, err := stream.NewProducer(rdb, stream.ProducerOptions{OutageWait: 1500 * time.Millisecond}).Publish(context.Background(), s, []byte("x"))
	if err == nil || !stream.Unreachable(err) {
		t.Fatalf("err = %v, want an unreachable-Redis error", err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("gave up after %s, before OutageWait", took)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{io.EOF, true},
		{redis.ErrClosed, false},
		{context.Canceled, false},
		{errors.New("LOADING Redis is loading the dataset in memory"), true},
		{errors.New("READONLY You can't write against a read only replica."), true},
		{errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
	} {
		if got := stream.Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
