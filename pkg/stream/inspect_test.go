package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestInspectorStreamAndGroups(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s, _ := names()
	in := stream.NewInspector(rdb)
	if _, err := in.Stream(ctx, s); !errors.Is(err, stream.ErrNotFound) {
		t.Fatalf("missing stream: %v, want ErrNotFound", err)
	}
	// Ten entries appended an hour ago (explicit ids), two groups: "busy"
	// has read four (one acknowledged) through two consumers, "idle" none.
	hourAgo := time.Now().Add(-time.Hour).UnixMilli()
	var ids []string
	for i := range 10 {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, ID: fmt.Sprintf("%d-%d", hourAgo, i), Values: map[string]any{"data": strconv.Itoa(i)}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, g := range []string{"busy", "idle"} {
		if err := rdb.XGroupCreate(ctx, s, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(consumer string, n int64) {
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "busy", Consumer: consumer, Streams: []string{s, ">"}, Count: n, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read("c1", 3)
	read("c2", 1)
	if err := rdb.XAck(ctx, s, "busy", ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s + stream.DeadLetterSuffix, Values: map[string]any{"data": "x"}}).Err(); err != nil {
		t.Fatal(err)
	}

	si, err := in.Stream(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if si.Length != 10 || si.FirstID != ids[0] || si.LastID != ids[9] || si.DeadLetters != 1 || len(si.Groups) != 2 {
		t.Fatalf("stream info %+v", si)
	}
	busy, idle := si.Groups[0], si.Groups[1]
	if busy.Group != "busy" || busy.Pending != 3 || busy.Lag != 6 || busy.LastDeliveredID != ids[3] || busy.EntriesRead != 4 {
		t.Fatalf("busy group %+v", busy)
	}
	if idle.Group != "idle" || idle.Pending != 0 || idle.Lag != 10 || idle.OldestPending != nil || len(idle.Consumers) != 0 {
		t.Fatalf("idle group %+v", idle)
	}
	op := busy.OldestPending
	if op == nil || op.ID != ids[1] || op.Consumer != "c1" || op.Deliveries != 1 {
		t.Fatalf("oldest pending %+v, want %s of c1, delivered once", op, ids[1])
	}
	if op.Age < time.Hour-time.Minute || op.Age > time.Hour+time.Minute {
		t.Fatalf("oldest pending age %v, want about an hour", op.Age)
	}
	if op.Idle < 0 || op.Idle > time.Minute {
		t.Fatalf("oldest pending idle %v", op.Idle)
	}
	consumers := map[string]int64{}
	for _, c := range busy.Consumers {
		if c.Idle < 0 || c.Idle > time.Minute {
			t.Errorf("consumer %s idle %v", c.Name, c.Idle)
		}
		consumers[c.Name] = c.Pending
	}
	if fmt.Sprint(consumers) != "map[c1:2 c2:1]" {
		t.Fatalf("consumers' pending %v", consumers)
	}

	gi, err := in.Group(ctx, s, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if gi.Pending != 3 || gi.OldestPending == nil || gi.OldestPending.ID != ids[1] || len(gi.Consumers) != 2 {
		t.Fatalf("Group(busy) = %+v", gi)
	}
	if _, err := in.Group(ctx, s, "nope"); !errors.Is(err, stream.ErrNotFound) {
		t.Fatalf("missing group: %v, want ErrNotFound", err)
	}
	if _, err := in.Group(ctx, s+"-nope", "busy"); !errors.Is(err, stream.ErrNotFound) {
		t.Fatalf("group of a missing stream: %v, want ErrNotFound", err)
	}
}

// deadLettered runs a consumer that dead-letters every entry of s whose
// data does not end in "-replayed" and records the others; it returns the
// dead letters' original ids and the recorder.
func deadLettered(t *testing.T, rdb redis.UniversalClient, s, g string, n int) ([]string, *recorder) {
	t.Helper()
	rec := newRecorder(1)
	rec.fn = func(_ context.Context, msg *stream.Message) error {
		if !strings.HasSuffix(string(msg.Data()), "-replayed") {
			return stream.Permanent("invalid_message", fmt.Errorf("cannot decode %q", msg.Data()))
		}
		if msg.Values[stream.ReplayFieldDeadID] == nil || msg.Values[stream.ReplayFieldOriginalID] == nil {
			t.Errorf("replayed entry without its origin: %v", msg.Values)
		}
		return nil
	}
	running(t, newConsumer(t, rdb, stream.Config{Group: g, Streams: []string{s}, Consumer: "c"}, rec))
	ids := publish(t, rdb, s, n)
	testenv.WaitFor(t, 20*time.Second, "dead letters", func() bool { return len(deadEntries(t, rdb, s)) == n })
	return ids, rec
}

func TestInspectorDeadLettersListShowDrop(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s, g := names()
	in := stream.NewInspector(rdb)
	orig, _ := deadLettered(t, rdb, s, g, 5)

	// Paged listing, oldest first.
	var all []stream.DeadLetter
	var pages int
	for after := ""; ; {
		page, err := in.DeadLetters(ctx, s, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, page.Letters...)
		if page.Next == "" {
			break
		}
		after = page.Next
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if pages != 3 || len(all) != 5 {
		t.Fatalf("%d dead letters in %d pages, want 5 in 3", len(all), pages)
	}
	// Handlers run concurrently: dead letters come in any order.
	index := map[string]int{}
	for i, id := range orig {
		index[id] = i
	}
	seen := map[string]bool{}
	for k, dl := range all {
		i, ok := index[dl.OriginalID]
		if !ok || seen[dl.OriginalID] || k > 0 && dl.ID <= all[k-1].ID {
			t.Fatalf("dead letter %d: %+v (unknown, repeated or out of order)", k, dl)
		}
		seen[dl.OriginalID] = true
		if dl.Stream != s || dl.Group != g || dl.Consumer != "c" ||
			dl.Reason != "invalid_message" || !strings.Contains(dl.Error, "cannot decode") ||
			dl.Deliveries != 1 || string(dl.Data()) != strconv.Itoa(i) || dl.Replay != nil ||
			time.Since(dl.At) > time.Minute {
			t.Fatalf("dead letter %d: %+v", k, dl)
		}
		if len(dl.Values) != 1 {
			t.Fatalf("dead letter %d: values %v, want only the original field", k, dl.Values)
		}
	}

	// Show one; a missing one is ErrNotFound.
	dl, err := in.DeadLetter(ctx, s, all[2].ID)
	if err != nil || dl.OriginalID != all[2].OriginalID || dl.Reason != all[2].Reason {
		t.Fatalf("DeadLetter: %+v, %v", dl, err)
	}
	if _, err := in.DeadLetter(ctx, s, "1-1"); !errors.Is(err, stream.ErrNotFound) {
		t.Fatalf("missing dead letter: %v, want ErrNotFound", err)
	}
	if _, err := in.DeadLetters(ctx, s, "not-an-id", 2); err == nil {
		t.Fatal("a bad cursor was accepted")
	}

	// Drop two.
	n, err := in.Drop(ctx, s, all[0].ID, all[3].ID, "1-1")
	if err != nil || n != 2 {
		t.Fatalf("Drop = %d, %v; want 2", n, err)
	}
	page, err := in.DeadLetters(ctx, s, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, dl := range page.Letters {
		left = append(left, dl.ID)
	}
	if want := []string{all[1].ID, all[2].ID, all[4].ID}; fmt.Sprint(left) != fmt.Sprint(want) || page.Next != "" {
		t.Fatalf("after drop: %v (next %q), want %v", left, page.Next, want)
	}
}

func TestInspectorReplay(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s, g := names()
	in := stream.NewInspector(rdb)
	_, rec := deadLettered(t, rdb, s, g, 2)
	page, err := in.DeadLetters(ctx, s, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	target := page.Letters[0]

	// A failing rewrite changes nothing.
	if _, err := in.Replay(ctx, s, target.ID, func(*stream.DeadLetter) (map[string]any, error) {
		return nil, errors.New("no new job id")
	}); err == nil || !strings.Contains(err.Error(), "no new job id") {
		t.Fatalf("failing rewrite: %v", err)
	}
	if dl, _ := in.DeadLetter(ctx, s, target.ID); dl.Replay != nil {
		t.Fatalf("failed replay recorded: %+v", dl.Replay)
	}

	// Two operators replay the same dead letter at once: one wins.
	rewrite := func(dl *stream.DeadLetter) (map[string]any, error) {
		return map[string]any{stream.DataField: string(dl.Data()) + "-replayed"}, nil
	}
	var wg sync.WaitGroup
	results := make([]error, 4)
	newIDs := make([]string, 4)
	for i := range results {
		wg.Go(func() { newIDs[i], results[i] = in.Replay(ctx, s, target.ID, rewrite) })
	}
	wg.Wait()
	var newID string
	for i, err := range results {
		switch {
		case err == nil && newID == "":
			newID = newIDs[i]
		case err == nil:
			t.Fatalf("replayed twice: %s and %s", newID, newIDs[i])
		case !errors.Is(err, stream.ErrReplayed):
			t.Fatalf("replay: %v", err)
		}
	}
	if newID == "" {
		t.Fatal("no replay succeeded")
	}

	// The new entry is on the original stream with its origin, and the
	// consumer handles it.
	msgs, err := rdb.XRangeN(ctx, s, newID, newID, 1).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("replayed entry %s: %v %v", newID, msgs, err)
	}
	v := msgs[0].Values
	want := string(target.Data()) + "-replayed"
	if v[stream.DataField] != want || v[stream.ReplayFieldDeadID] != target.ID || v[stream.ReplayFieldOriginalID] != target.OriginalID {
		t.Fatalf("replayed entry fields %v", v)
	}
	select {
	case <-rec.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the replayed entry was not handled")
	}
	if runs, _ := rec.snapshot(); runs[want] != 1 || len(runs) != 1 {
		t.Fatalf("handler runs %v", runs)
	}

	// The replay is recorded with the dead letter; a second one is refused.
	dl, err := in.DeadLetter(ctx, s, target.ID)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Replay == nil || dl.Replay.NewID != newID || time.Since(dl.Replay.At) > time.Minute {
		t.Fatalf("replay record %+v, want %s", dl.Replay, newID)
	}
	if _, err := in.Replay(ctx, s, target.ID, nil); !errors.Is(err, stream.ErrReplayed) {
		t.Fatalf("second replay: %v, want ErrReplayed", err)
	}
	if other, _ := in.DeadLetter(ctx, s, page.Letters[1].ID); other.Replay != nil {
		t.Fatalf("the other dead letter shows a replay: %+v", other.Replay)
	}
	// Dropping the dead letter drops its record.
	if _, err := in.Drop(ctx, s, target.ID); err != nil {
		t.Fatal(err)
	}
	if n := rdb.HLen(ctx, s+stream.ReplaysSuffix).Val(); n != 0 {
		t.Fatalf("%d replay records left after the drop", n)
	}
	if _, err := in.Replay(ctx, s, target.ID, nil); !errors.Is(err, stream.ErrNotFound) {
		t.Fatalf("replay of a dropped dead letter: %v, want ErrNotFound", err)
	}
}
