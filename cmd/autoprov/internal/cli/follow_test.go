package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestFollowFinishedJob: follow of a job that is over prints its events
// once and its result at once, and exits with its status, whether its
// result is still on the results stream or was consumed and trimmed from
// it (then the run_finished event, which outlives it, tells the status).
// It must not wait out --timeout.
func TestFollowFinishedJob(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	env := map[string]string{"REDIS_URL": url}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		results   string // the results stream; "" when the result was trimmed
		status    messages.Status
		json      bool
		wantCode  int
		wantLines []string
	}{
		{"provision succeeded", messages.StreamProvisionerResults, messages.StatusSucceeded, false, 0, []string{"result: succeeded"}},
		{"deploy failed", messages.StreamDeployResults, messages.StatusFailed, false, 1, []string{"result: failed: boom"}},
		{"trimmed, succeeded", "", messages.StatusSucceeded, false, 0, []string{"result: succeeded", "run_finished event"}},
		{"trimmed, unreachable", "", messages.StatusUnreachable, false, 1, []string{"result: unreachable: 1 host unreachable"}},
		{"trimmed, failed, json", "", messages.StatusFailed, true, 1, []string{`"status": "failed"`, `"from": "run_finished"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobID := strings.ReplaceAll(tc.name, " ", "-")
			jobID = strings.ReplaceAll(jobID, ",", "")
			// The job ended a minute ago.
			at := time.Now().Add(-time.Minute).UnixMilli()
			message := ""
			switch tc.status {
			case messages.StatusFailed:
				message = "boom"
			case messages.StatusUnreachable:
				message = "1 host unreachable"
			}
			events := []messages.ProgressEvent{
				{Type: messages.EventRunStarted},
				{Type: messages.EventPlayStarted, Play: "Provision"},
				{Type: messages.EventTaskStarted, Task: "Ping"},
				{Type: messages.EventHostChanged, Host: "web-1", Task: "Ping"},
				{Type: messages.EventRunFinished, Status: tc.status, Message: message},
			}
			kind := messages.JobKindProvision
			if tc.results == messages.StreamDeployResults {
				kind = messages.JobKindDeploy
			}
			for n := range events {
				e := &events[n]
				e.JobID, e.Seq, e.Time = jobID, int64(n+1), messages.FormatTime(time.UnixMilli(at))
				data, err := messages.Encode(e)
				if err != nil {
					t.Fatal(err)
				}
				id := fmt.Sprintf("%d-%d", at, n+1)
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(kind, jobID), ID: id, Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.results != "" {
				out := messages.Outcome{JobID: jobID, Status: tc.status}
				if message != "" {
					out.Error = &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: message}
				}
				var data []byte
				var err error
				if tc.results == messages.StreamDeployResults {
					r := messages.NewAnsibleDeployResult(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerIP: "198.51.100.7"}, "1-0")
					r.Status, r.Error = out.Status, out.Error
					data, err = messages.Encode(r)
				} else {
					r := messages.NewProvisionerResult(&messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerHandle: "web-1"}, "1-0")
					r.Status, r.Error = out.Status, out.Error
					data, err = messages.Encode(r)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: tc.results, Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
					t.Fatal(err)
				}
			}

			args := []string{"follow", jobID, "--timeout", "1h"}
			if tc.json {
				args = append([]string{"--json"}, args...)
			}
			start := time.Now()
			out, errOut, code := run(t, env, args...)
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("follow of a finished job took %s (waits out --timeout?)", took)
			}
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.wantCode, out, errOut)
			}
			for _, want := range tc.wantLines {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if tc.json {
				var res map[string]any
				mustJSON(t, out, &res)
				if res["job_id"] != jobID || res["status"] != string(tc.status) {
					t.Errorf("--json result %v", res)
				}
				return
			}
			for _, once := range []string{"play  Provision", "task  Ping", "web-1: changed", "run finished: " + string(tc.status)} {
				if n := strings.Count(out, once); n != 1 {
					t.Errorf("%q printed %d times, want once:\n%s", once, n, out)
				}
			}
		})
	}
}
