package stream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// A handler that frees what a waiting entry waits for hands its slot to
// it (stream.HandOff): the waiting entry runs again as soon as the handler
// returned, long before its Later delay is over, without a delivery
// counted, and on the one slot there is. An entry that runs is not taken.
// Its Message.Pickup is the time from the holder's return to its start,
// not the time it waited released.
func TestHandOffRunsTheWaitingEntryAtOnce(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, g := names()
	const delay = 5 * time.Second // a quarter of the lease: the longest that can be handed over
	type look struct {
		at         time.Time
		deliveries int64
		pickup     time.Duration
	}
	var mu sync.Mutex
	looks := map[string][]look{}
	var waiterID string
	holderIn, holderGo := make(chan struct{}), make(chan struct{})
	var returned time.Time
	ev := newEvents()
	h := stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		mu.Lock()
		looks[string(msg.Data())] = append(looks[string(msg.Data())], look{time.Now(), msg.Deliveries, msg.Pickup})
		n := len(looks["waiter"])
		mu.Unlock()
		switch string(msg.Data()) {
		case "waiter":
			if n == 1 {
				return stream.Later(delay, errors.New("server busy"))
			}
			return nil
		default: // the holder: it frees the server, handing its slot on
			close(holderIn)
			<-holderGo
			// The running holder itself cannot be taken; the waiter can.
			stream.HandOff(ctx, stream.Entry{Stream: s, ID: msg.ID}, stream.Entry{Stream: s, ID: waiterID})
			mu.Lock()
			returned = time.Now()
			mu.Unlock()
			return nil
		}
	})
	running(t, newConsumer(t, rdb, stream.Config{
		Group: g, Streams: []string{s}, Concurrency: 1, Lease: 4 * delay, ClaimInterval: time.Minute, Hook: ev.hook,
	}, h))
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	id, err := p.Publish(context.Background(), s, []byte("waiter"))
	if err != nil {
		t.Fatal(err)
	}
	waiterID = id
	ev.waitCount(t, 30*time.Second, stream.EventRetry, waiterID, 1)
	if _, err := p.Publish(context.Background(), s, []byte("holder")); err != nil {
		t.Fatal(err)
	}
	<-holderIn
	close(holderGo)
	ev.waitCount(t, 30*time.Second, stream.EventAcked, waiterID, 1)

	mu.Lock()
	defer mu.Unlock()
	w := looks["waiter"]
	if len(w) != 2 {
		t.Fatalf("the waiter ran %d times, want 2", len(w))
	}
	if again := w[1].at.Sub(w[0].at); again >= delay {
		t.Errorf("the waiter ran again %v after it was told to wait, want before its delay (%v) was over", again, delay)
	}
	if w[1].at.Before(returned) {
		t.Errorf("the waiter ran again before the holder returned")
	}
	if w[1].deliveries != 1 {
		t.Errorf("the waiter's second run counted delivery %d, want 1 (Later does not count)", w[1].deliveries)
	}
	if gap := w[1].at.Sub(returned); w[1].pickup <= 0 || w[1].pickup > gap {
		t.Errorf("the handed-off waiter's Pickup %v, want in (0, %v] (from the holder's return to its start)", w[1].pickup, gap)
	}
	if n := ev.count(stream.EventHandedOff, waiterID); n != 1 {
		t.Errorf("%d hand-offs to the waiter, want 1", n)
	}
	if len(looks["holder"]) != 1 {
		t.Errorf("the holder ran %d times, want 1", len(looks["holder"]))
	}
}
