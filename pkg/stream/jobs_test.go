package stream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// addEvents appends progress events of the given types to the job's
// progress stream (seq continuing from first) and returns their ids.
func addEvents(t testing.TB, rdb redis.UniversalClient, kind messages.JobKind, jobID string, first int64, types ...messages.EventType) []string {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerOptions{})
	var ids []string
	for i, typ := range types {
		ev := &messages.ProgressEvent{JobID: jobID, Seq: first + int64(i), Time: messages.FormatTime(time.Now()), Type: typ}
		switch {
		case typ == messages.EventRunFinished:
			ev.Status = messages.StatusSucceeded
		case typ.HostEvent():
			ev.Host = "web1"
		}
		data, err := messages.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		id, err := p.Publish(context.Background(), messages.ProgressStream(kind, jobID), data)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// followAll follows the job and returns the seqs of the events handed over.
func followAll(ctx context.Context, jobs *stream.Jobs, kind messages.JobKind, jobID, after string) ([]int64, []string, error) {
	var seqs []int64
	var ids []string
	err := jobs.FollowJob(ctx, kind, jobID, after, 50*time.Millisecond, func(ev stream.JobEvent) error {
		if ev.Err != nil {
			return ev.Err
		}
		seqs = append(seqs, ev.Event.Seq)
		ids = append(ids, ev.ID)
		return nil
	})
	return seqs, ids, err
}

func TestFollowJob(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	kind := messages.JobKindDeploy
	jobID := testenv.Unique("job-")
	ids := addEvents(t, rdb, kind, jobID, 1,
		messages.EventRunStarted, messages.EventPlayStarted, messages.EventTaskStarted, messages.EventHostOK,
		messages.EventRunFinished, messages.EventRunStarted) // a later attempt's event is not read
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tests := []struct {
		name  string
		after string
		want  []int64
	}{
		{"from the start", "", []int64{1, 2, 3, 4, 5}},
		{"from 0-0", "0-0", []int64{1, 2, 3, 4, 5}},
		{"resumes after an id", ids[2], []int64{4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seqs, got, err := followAll(ctx, jobs, kind, jobID, tt.after)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(seqs) != fmt.Sprint(tt.want) {
				t.Fatalf("seqs %v, want %v", seqs, tt.want)
			}
			if last := got[len(got)-1]; last != ids[4] {
				t.Fatalf("last id %s, want run_finished's %s", last, ids[4])
			}
		})
	}
}

func TestFollowJobWaitsForALateStream(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	kind := messages.JobKindProvision
	jobID := testenv.Unique("job-")
	type outcome struct {
		seqs []int64
		err  error
	}
	done := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		seqs, _, err := followAll(ctx, jobs, kind, jobID, "")
		done <- outcome{seqs, err}
	}()
	time.Sleep(200 * time.Millisecond) // several reads of a stream that does not exist
	addEvents(t, rdb, kind, jobID, 1, messages.EventRunStarted)
	time.Sleep(100 * time.Millisecond)
	select {
	case o := <-done:
		t.Fatalf("follow ended before run_finished: %v %v", o.seqs, o.err)
	default:
	}
	addEvents(t, rdb, kind, jobID, 2, messages.EventHostChanged, messages.EventRunFinished)
	o := <-done
	if o.err != nil || fmt.Sprint(o.seqs) != "[1 2 3]" {
		t.Fatalf("got %v, %v; want [1 2 3], nil", o.seqs, o.err)
	}
}

func TestFollowJobEndsWithItsContext(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	jobID := testenv.Unique("job-")
	addEvents(t, rdb, messages.JobKindDeploy, jobID, 1, messages.EventRunStarted)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	seqs, _, err := followAll(ctx, jobs, messages.JobKindDeploy, jobID, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the context's", err)
	}
	if fmt.Sprint(seqs) != "[1]" {
		t.Fatalf("seqs %v, want [1]", seqs)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("ended %s after start: the blocking read is not bounded", d)
	}
}

func TestFollowJobStopsOnHandlerError(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	jobID := testenv.Unique("job-")
	addEvents(t, rdb, messages.JobKindDeploy, jobID, 1, messages.EventRunStarted, messages.EventPlayStarted)
	boom := errors.New("client gone")
	n := 0
	err := jobs.FollowJob(context.Background(), messages.JobKindDeploy, jobID, "", time.Second, func(stream.JobEvent) error {
		n++
		return boom
	})
	if !errors.Is(err, boom) || n != 1 {
		t.Fatalf("err %v after %d events, want %v after 1", err, n, boom)
	}
}

func TestReadJobs(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	a, b, c := testenv.Unique("job-a-"), testenv.Unique("job-b-"), testenv.Unique("job-c-")
	aIDs := addEvents(t, rdb, messages.JobKindDeploy, a, 1, messages.EventRunStarted, messages.EventHostOK, messages.EventRunFinished)
	addEvents(t, rdb, messages.JobKindProvision, b, 1, messages.EventRunStarted)
	ctx := context.Background()
	cursors := []stream.JobCursor{
		{Kind: messages.JobKindDeploy, JobID: a, ID: aIDs[0]},
		{Kind: messages.JobKindProvision, JobID: b, ID: "0-0"},
		{Kind: messages.JobKindDeploy, JobID: c, ID: "0-0"}, // no stream yet
	}
	got, err := jobs.ReadJobs(ctx, cursors, stream.ReadArgs{Block: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || len(got[0]) != 2 || len(got[1]) != 1 || len(got[2]) != 0 {
		t.Fatalf("got %d/%d/%d events, want 2/1/0", len(got[0]), len(got[1]), len(got[2]))
	}
	if got[0][0].Err != nil {
		t.Fatal(got[0][0].Err)
	}
	if got[0][0].Event.Seq != 2 || !got[0][1].Final() || got[0][0].Final() {
		t.Fatalf("job a: %+v", got[0])
	}

	// Nothing new: the read waits Block and comes back empty; an event of
	// a stream created meanwhile ends the wait.
	cursors[0].ID, cursors[1].ID = got[0][1].ID, got[1][0].ID
	start := time.Now()
	got, err = jobs.ReadJobs(ctx, cursors, stream.ReadArgs{Block: 200 * time.Millisecond})
	if err != nil || len(got[0])+len(got[1])+len(got[2]) != 0 {
		t.Fatalf("got %v, %v; want nothing", got, err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("came back after %s: did not block", d)
	}
	added := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		ev := &messages.ProgressEvent{JobID: c, Seq: 1, Time: messages.FormatTime(time.Now()), Type: messages.EventRunStarted}
		data, err := messages.Encode(ev)
		if err == nil {
			_, err = stream.NewProducer(rdb, stream.ProducerOptions{}).Publish(ctx, messages.ProgressStream(messages.JobKindDeploy, c), data)
		}
		added <- err
	}()
	// The reply to the publish may come after the read has seen the entry:
	// wait for it before the test ends and closes the client.
	defer func() {
		if err := <-added; err != nil {
			t.Errorf("add job c's event: %v", err)
		}
	}()
	got, err = jobs.ReadJobs(ctx, cursors, stream.ReadArgs{Block: 5 * time.Second})
	if err != nil || len(got[2]) != 1 || got[2][0].Event.JobID != c {
		t.Fatalf("got %v, %v; want job c's first event", got, err)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	ctx := context.Background()
	jobID := testenv.Unique("job-")
	key, err := jobs.Cancel(ctx, messages.JobKindProvision, jobID, "operator", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if key != messages.CancelKey(messages.JobKindProvision, jobID) {
		t.Fatalf("key %q", key)
	}
	if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "operator" {
		t.Fatalf("value %q, %v", v, err)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("ttl %s, want about an hour", ttl)
	}
	if n := rdb.Exists(ctx, messages.CancelKey(messages.JobKindDeploy, jobID)).Val(); n != 0 {
		t.Fatal("the other kind's key was set")
	}

	started, err := jobs.Started(ctx, messages.JobKindProvision, jobID)
	if err != nil || started {
		t.Fatalf("started %v, %v before any event", started, err)
	}
	addEvents(t, rdb, messages.JobKindProvision, jobID, 1, messages.EventRunStarted)
	if started, err = jobs.Started(ctx, messages.JobKindProvision, jobID); err != nil || !started {
		t.Fatalf("started %v, %v after an event", started, err)
	}
}

func TestJobEventsRange(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	jobs := stream.NewJobs(rdb)
	ctx := context.Background()
	jobID := testenv.Unique("job-")
	if evs, err := jobs.Events(ctx, messages.JobKindDeploy, jobID, "", 100); err != nil || len(evs) != 0 {
		t.Fatalf("no stream: %v, %v", evs, err)
	}
	ids := addEvents(t, rdb, messages.JobKindDeploy, jobID, 1, messages.EventRunStarted, messages.EventHostOK, messages.EventRunFinished)
	evs, err := jobs.Events(ctx, messages.JobKindDeploy, jobID, ids[0], 1)
	if err != nil || len(evs) != 1 || evs[0].ID != ids[1] || evs[0].Event.Type != messages.EventHostOK {
		t.Fatalf("got %+v, %v; want the second event alone", evs, err)
	}
	evs, err = jobs.Events(ctx, messages.JobKindDeploy, jobID, "", 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("got %d, %v; want 3", len(evs), err)
	}
}
