package stream_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestTrimNeverDropsWhatAGroupHasNotRead(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s, _ := names()
	// Without groups nothing is trimmed.
	ids := publish(t, rdb, s, 500)
	if minID, n, err := stream.TrimToGroups(ctx, rdb, s); err != nil || n != 0 || minID != "" {
		t.Fatalf("trim without groups: minID=%q removed=%d err=%v", minID, n, err)
	}
	for _, g := range []string{"fast", "slow"} {
		if err := rdb.XGroupCreate(ctx, s, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// "fast" reads and acknowledges everything; "slow" reads the first 300
	// and acknowledges only the first 100.
	read := func(g string, count int64) []redis.XMessage {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "c", Streams: []string{s, ">"}, Count: count, Block: -1}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Messages
	}
	for _, m := range read("fast", 1000) {
		rdb.XAck(ctx, s, "fast", m.ID)
	}
	for _, m := range read("slow", 300)[:100] {
		rdb.XAck(ctx, s, "slow", m.ID)
	}
	minID, err := stream.SafeMinID(ctx, rdb, s)
	if err != nil {
		t.Fatal(err)
	}
	if minID != ids[100] {
		t.Fatalf("safe min id = %s, want the oldest pending entry %s", minID, ids[100])
	}
	if _, _, err := stream.TrimToGroups(ctx, rdb, s); err != nil {
		t.Fatal(err)
	}
	left, err := rdb.XRange(ctx, s, ids[100], "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 400 {
		t.Fatalf("%d entries from the oldest pending one on, want 400", len(left))
	}
	// Once "slow" is done, trimming may drop everything but the last node.
	for _, m := range read("slow", 1000) {
		rdb.XAck(ctx, s, "slow", m.ID)
	}
	rdb.XAck(ctx, s, "slow", ids[100:300]...)
	minID, err = stream.SafeMinID(ctx, rdb, s)
	if err != nil {
		t.Fatal(err)
	}
	last := ids[len(ids)-1]
	if want := nextID(t, last); minID != want {
		t.Fatalf("safe min id = %s after everything was read, want %s (the id after %s)", minID, want, last)
	}
	if _, n, err := stream.TrimToGroups(ctx, rdb, s); err != nil || n == 0 {
		t.Fatalf("trim after all read: removed=%d err=%v", n, err)
	}
}

func nextID(t *testing.T, id string) string {
	t.Helper()
	ms, seq, _ := strings.Cut(id, "-")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ms + "-" + strconv.FormatUint(n+1, 10)
}

func TestProducerSafetyMaxLen(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s, _ := names()
	p := stream.NewProducer(rdb, stream.ProducerOptions{SafetyMaxLen: 100})
	for range 1000 {
		if _, err := p.Publish(ctx, s, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	n, err := rdb.XLen(ctx, s).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Approximate trimming keeps at least 100 and removes whole nodes only.
	if n < 100 || n >= 1000 {
		t.Fatalf("length %d with safety MAXLEN ~100 after 1000 entries", n)
	}
}

// TestProducerSignsEntries: with Sign set, every entry carries the
// signature of its own data for its stream; a failing signer publishes
// nothing.
func TestProducerSignsEntries(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	s, _ := names()
	ctx := context.Background()
	p := stream.NewProducer(rdb, stream.ProducerOptions{Sign: func(st string, data []byte) (string, error) {
		return "sig(" + st + "," + string(data) + ")", nil
	}})
	if _, err := p.Publish(ctx, s, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.PublishBatch(ctx, s, [][]byte{[]byte("two"), []byte("three")}); err != nil {
		t.Fatal(err)
	}
	msgs, err := rdb.XRange(ctx, s, "-", "+").Result()
	if err != nil || len(msgs) != 3 {
		t.Fatalf("entries: %v %v", msgs, err)
	}
	for _, m := range msgs {
		if want := "sig(" + s + "," + m.Values[stream.DataField].(string) + ")"; m.Values[stream.SigField] != want {
			t.Errorf("entry %s: sig %v, want %s", m.ID, m.Values[stream.SigField], want)
		}
	}
	bad := stream.NewProducer(rdb, stream.ProducerOptions{Sign: func(string, []byte) (string, error) {
		return "", errors.New("no key")
	}})
	if _, err := bad.Publish(ctx, s, []byte("x")); err == nil {
		t.Fatal("published without its signature")
	}
	if n, _ := rdb.XLen(ctx, s).Result(); n != 3 {
		t.Fatalf("stream has %d entries, want 3", n)
	}
}
