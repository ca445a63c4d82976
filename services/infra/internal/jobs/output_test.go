package jobs_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// watchedLogs is the real Postgres run log store, watched: for every Put
// it records whether the job's result was already on deploy:results when
// the log was stored, and it can be made to fail.
type watchedLogs struct {
	runlog.Store
	w    *world
	fail error // Put reads everything, then fails with it

	mu     sync.Mutex
	puts   map[string]int
	before map[string]bool // stored before any result of the job was published
}

func (l *watchedLogs) Put(ctx context.Context, jobID string, r io.Reader) (runlog.Info, error) {
	if l.fail != nil {
		_, _ = io.Copy(io.Discard, r)
		return runlog.Info{}, l.fail
	}
	info, err := l.Store.Put(ctx, jobID, r)
	published := 0
	entries, xerr := l.w.rdb.XRange(ctx, messages.StreamDeployResults, "-", "+").Result()
	for _, e := range entries {
		data, _ := e.Values[stream.DataField].(string)
		if res, derr := messages.DecodeAnsibleDeployResult([]byte(data)); derr == nil && res.JobID == jobID {
			published++
		}
	}
	if xerr != nil {
		published = -1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.puts[jobID]++
		l.before[jobID] = published == 0
	}
	return info, err
}

// writes is a run that prints lines through OnOutput as the runner does
// (redacted with the spec's Redact), then behaves as then.
func writes(lines []string, then func(context.Context, ansible.Spec) (*ansible.Result, error)) func(context.Context, ansible.Spec) (*ansible.Result, error) {
	return func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
		for _, line := range lines {
			if spec.OnOutput != nil {
				spec.OnOutput(spec.Redact(line))
			}
		}
		return then(ctx, spec)
	}
}

// TestRunOutputIsStored checks infra's side of the full run logs: the whole
// redacted output of a run is stored (in the real Postgres backend) before
// its result is published; a request's timeout_seconds caps the run's time
// limit; a run handed over stores nothing; a store that fails loses the log
// but never the result.
func TestRunOutputIsStored(t *testing.T) {
	t.Parallel()
	lines := []string{"PLAY [Deploy] ***", "TASK [clone] ***", "cloning with token " + ghToken, "PLAY RECAP ***"}
	for _, tc := range []struct {
		name      string
		timeout   int // the request's timeout_seconds
		run       func(context.Context, ansible.Spec) (*ansible.Result, error)
		interrupt func(cancel context.CancelCauseFunc)
		cancelKey bool // interrupt by setting the job's cancel key
		failStore error
		wantErr   error           // from Handle
		status    messages.Status // of the published result; empty: none
		wantLog   bool
		wantCap   time.Duration
	}{
		{name: "succeeded", run: writes(lines, plays(ansible.OutcomeSucceeded)),
			status: messages.StatusSucceeded, wantLog: true},
		{name: "failed, with the request's time limit", timeout: 90, run: writes(lines, plays(ansible.OutcomeFailed)),
			status: messages.StatusFailed, wantLog: true, wantCap: 90 * time.Second},
		{name: "cancelled by shutdown: handed over, nothing stored", run: writes(lines, blocks()),
			interrupt: func(cancel context.CancelCauseFunc) { cancel(stream.ErrShutdown) },
			wantErr:   stream.ErrShutdown},
		{name: "cancelled on request: its deploy cancel key", run: writes(lines, blocks()),
			cancelKey: true, status: messages.StatusCancelled, wantLog: true},
		{name: "store down: the result stands", run: writes(lines, plays(ansible.OutcomeSucceeded)),
			failStore: errors.New("bucket gone"), status: messages.StatusSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			f := w.newFakes()
			f.runner = newFakeRunner(tc.run)
			logs := &watchedLogs{Store: runlog.NewPostgres(w.pool, runlog.DefaultMaxBytes), w: w, fail: tc.failStore,
				puts: map[string]int{}, before: map[string]bool{}}
			f.runLogs = logs
			h := w.handler(t, f, nil)
			jobID := "deploy-" + strings.ReplaceAll(tc.name, " ", "-")
			jobID = jobID[:min(len(jobID), 60)]
			msg := w.message(t, messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
				RequestMeta: messages.RequestMeta{JobID: jobID}, ProjectID: "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f",
				RepoFullName: "acme/shop", Branch: "main", ServerIP: "192.0.2.20", Port: 8080,
				GitHubTokenRef: "env:AUTOPROV_PROJECT_GH", TimeoutSeconds: tc.timeout,
			}, 1)
			interrupt := tc.interrupt
			if tc.cancelKey {
				interrupt = func(context.CancelCauseFunc) {
					if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindDeploy, jobID), "1", time.Hour).Err(); err != nil {
						t.Error(err)
					}
				}
			}
			err := handle(t, h, f.runner.started, msg, interrupt)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Handle: %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Handle: %v", err)
			}

			specs := f.runner.calls()
			if len(specs) != 1 {
				t.Fatalf("%d plays", len(specs))
			}
			if specs[0].TimeoutCap != tc.wantCap {
				t.Errorf("TimeoutCap %v, want %v", specs[0].TimeoutCap, tc.wantCap)
			}
			rs := w.deployResults(t, jobID)
			switch {
			case tc.status == "" && len(rs) != 0:
				t.Errorf("%d results published, want none", len(rs))
			case tc.status != "" && (len(rs) != 1 || rs[0].Status != tc.status):
				t.Fatalf("results %+v, want one %s", rs, tc.status)
			}
			// Progress went to the deploy kind's stream, ending with the end.
			if types := w.progressTypes(t, messages.JobKindDeploy, jobID); tc.status != "" &&
				(len(types) == 0 || types[len(types)-1] != messages.EventRunFinished) {
				t.Errorf("progress on %s: %v", messages.ProgressStream(messages.JobKindDeploy, jobID), types)
			}

			rc, _, err := logs.Store.Open(context.Background(), jobID)
			if !tc.wantLog {
				if !errors.Is(err, runlog.ErrNotFound) {
					t.Errorf("a log was stored (%v), want none", err)
				}
				if err == nil {
					rc.Close()
				}
				return
			}
			if err != nil {
				t.Fatalf("run log: %v", err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Join([]string{lines[0], lines[1], "cloning with token " + secrets.Redacted, lines[3]}, "\n") + "\n"
			if string(data) != want {
				t.Errorf("stored log:\n%s\nwant:\n%s", data, want)
			}
			logs.mu.Lock()
			defer logs.mu.Unlock()
			if logs.puts[jobID] != 1 || !logs.before[jobID] {
				t.Errorf("%d stores, before the result: %v; want one, before", logs.puts[jobID], logs.before[jobID])
			}
			if r := w.run(t, jobID); r.State != store.RunDone {
				t.Errorf("run row %s", r.State)
			}
		})
	}
}
