package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func startRun(t *testing.T, pool *pgxpool.Pool, jobID, owner string) (*store.Run, bool) {
	t.Helper()
	r, started, err := store.StartRun(context.Background(), pool, store.RunStart{
		JobID: jobID, Kind: store.RunProvision, Stream: "infra:requests", RequestID: "req-" + jobID,
		Target: "web-1", ServerHandle: "web-1", Playbook: "provision.yml", Owner: owner,
	})
	if err != nil {
		t.Fatalf("start run %s as %s: %v", jobID, owner, err)
	}
	return r, started
}

func TestStartRunNewTakeoverDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "web-1", "192.0.2.10")

	if _, err := store.GetRun(ctx, pool, "job-1"); !errors.Is(err, store.ErrRunNotFound) {
		t.Fatalf("missing run: err = %v, want ErrRunNotFound", err)
	}

	// New: a running row, attempt 1.
	r, started := startRun(t, pool, "job-1", "infra-a")
	if !started || r.State != store.RunRunning || r.Attempt != 1 || r.Owner != "infra-a" || r.Status != "" ||
		r.ServerHandle != "web-1" || r.Playbook != "provision.yml" || r.StartedAt.IsZero() || !r.FinishedAt.IsZero() ||
		len(r.Checkpoint) != 0 || r.Result != nil {
		t.Fatalf("new run = %+v started=%v", r, started)
	}
	if err := store.SaveCheckpoint(ctx, pool, "job-1", 1, map[string]any{"reinstall_task_id": 991}); err != nil {
		t.Fatal(err)
	}

	// Takeover: infra-a died; infra-b (holding the locks now) takes the run.
	r2, started := startRun(t, pool, "job-1", "infra-b")
	if !started || r2.State != store.RunRunning || r2.Attempt != 2 || r2.Owner != "infra-b" ||
		!r2.StartedAt.Equal(r.StartedAt) || r2.Checkpoint["reinstall_task_id"] != float64(991) {
		t.Fatalf("taken-over run = %+v started=%v", r2, started)
	}

	// The dead owner's attempt can no longer write.
	if err := store.FinishRun(ctx, pool, "job-1", 1, store.RunSucceeded, "", []byte("stale")); !errors.Is(err, store.ErrStaleAttempt) {
		t.Fatalf("stale finish: err = %v, want ErrStaleAttempt", err)
	}
	if err := store.SaveCheckpoint(ctx, pool, "job-1", 1, map[string]any{"x": 1}); !errors.Is(err, store.ErrStaleAttempt) {
		t.Fatalf("stale checkpoint: err = %v, want ErrStaleAttempt", err)
	}
	if err := store.TouchRun(ctx, pool, "job-1", 1); !errors.Is(err, store.ErrStaleAttempt) {
		t.Fatalf("stale touch: err = %v, want ErrStaleAttempt", err)
	}
	if err := store.TouchRun(ctx, pool, "job-1", 2); err != nil {
		t.Fatal(err)
	}

	result := []byte{0x81, 0xa1, 'k', 0xa1, 'v'}
	if err := store.FinishRun(ctx, pool, "job-1", 2, store.RunFailed, "playbook_failed", result); err != nil {
		t.Fatal(err)
	}
	if err := store.FinishRun(ctx, pool, "job-1", 2, store.RunSucceeded, "", nil); !errors.Is(err, store.ErrRunDone) {
		t.Fatalf("second finish: err = %v, want ErrRunDone", err)
	}
	if err := store.SaveCheckpoint(ctx, pool, "job-1", 2, map[string]any{"x": 1}); !errors.Is(err, store.ErrRunDone) {
		t.Fatalf("checkpoint after finish: err = %v, want ErrRunDone", err)
	}

	// Done: a redelivery gets the stored result back, not a new run.
	r3, started := startRun(t, pool, "job-1", "infra-c")
	if started || r3.State != store.RunDone || r3.Status != store.RunFailed || r3.ErrorKind != "playbook_failed" ||
		string(r3.Result) != string(result) || r3.Attempt != 2 || r3.Owner != "infra-b" || r3.FinishedAt.IsZero() {
		t.Fatalf("done run = %+v started=%v", r3, started)
	}

	for name, err := range map[string]error{
		"finish":     store.FinishRun(ctx, pool, "nope", 1, store.RunSucceeded, "", nil),
		"checkpoint": store.SaveCheckpoint(ctx, pool, "nope", 1, nil),
		"touch":      store.TouchRun(ctx, pool, "nope", 1),
	} {
		if !errors.Is(err, store.ErrRunNotFound) {
			t.Errorf("%s on a missing run: err = %v, want ErrRunNotFound", name, err)
		}
	}
	// The schema refuses a status outside the contract.
	if _, started := startRun(t, pool, "job-2", "infra-a"); !started {
		t.Fatal("job-2 not started")
	}
	if err := store.FinishRun(ctx, pool, "job-2", 1, "bogus", "", nil); err == nil {
		t.Fatal("finished a run with status bogus")
	}
}

func TestSaveCheckpointMerges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	if _, started, err := store.StartRun(ctx, pool, store.RunStart{
		JobID: "job-1", Kind: store.RunDeploy, Stream: "s", RequestID: "r", Target: "203.0.113.5:22", Owner: "infra-a",
	}); err != nil || !started {
		t.Fatalf("start: started=%v err=%v", started, err)
	}
	steps := []map[string]any{
		{"reinstall_task_id": 991, "phase": "reinstall"},
		{"phase": "wait_ssh", "address": "203.0.113.5"},
		nil,
		{"nested": map[string]any{"a": []any{1, "two"}}},
	}
	for _, s := range steps {
		if err := store.SaveCheckpoint(ctx, pool, "job-1", 1, s); err != nil {
			t.Fatal(err)
		}
	}
	r, err := store.GetRun(ctx, pool, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"reinstall_task_id": float64(991), "phase": "wait_ssh", "address": "203.0.113.5",
		"nested": map[string]any{"a": []any{float64(1), "two"}},
	}
	if diff := cmp.Diff(want, r.Checkpoint); diff != "" {
		t.Fatalf("checkpoint (-want +got):\n%s", diff)
	}
	if r.ServerHandle != "" || r.Playbook != "" || r.Kind != store.RunDeploy {
		t.Fatalf("deploy run without server/playbook = %+v", r)
	}
}

// TestStartRunJobKindConflict: a job id used by a provision job cannot be
// reused by a deploy (or the other way round), running or done: the caller
// gets ErrJobKindConflict and the row is left as it was, so a deploy never
// republishes a provisioning result.
func TestStartRunJobKindConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "web-1", "192.0.2.10")
	deploy := store.RunStart{JobID: "job-x", Kind: store.RunDeploy, Stream: "ansible:deploy:queue",
		RequestID: "2-0", Target: "address:192.0.2.99", Owner: "infra-b"}

	r, _ := startRun(t, pool, "job-x", "infra-a")
	for _, state := range []string{store.RunRunning, store.RunDone} {
		if state == store.RunDone {
			if err := store.FinishRun(ctx, pool, "job-x", 1, store.RunSucceeded, "", []byte("provision result")); err != nil {
				t.Fatal(err)
			}
		}
		got, started, err := store.StartRun(ctx, pool, deploy)
		if !errors.Is(err, store.ErrJobKindConflict) || started {
			t.Fatalf("%s provision run: deploy start = started %v, err %v; want ErrJobKindConflict", state, started, err)
		}
		if got == nil || got.Kind != store.RunProvision {
			t.Fatalf("%s: conflicting run = %+v", state, got)
		}
		now, err := store.GetRun(ctx, pool, "job-x")
		if err != nil {
			t.Fatal(err)
		}
		if now.Attempt != r.Attempt || now.Owner != "infra-a" || now.Kind != store.RunProvision || now.State != state {
			t.Fatalf("%s: the conflicting start changed the row: %+v", state, now)
		}
	}
}
