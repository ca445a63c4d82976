package cli

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing/otlptest"
)

// fakeDeployInfra plays infra's side for deploys: it takes the next request
// from ansible:deploy:queue, appends progress events and a result with the
// given status.
func fakeDeployInfra(t *testing.T, rdb *redis.Client, status messages.Status) <-chan *messages.AnsibleDeployMessage {
	t.Helper()
	got := make(chan *messages.AnsibleDeployMessage, 1)
	go func() {
		defer close(got)
		ctx := context.Background()
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{messages.StreamAnsibleDeployQueue, "0-0"}, Count: 1, Block: 30 * time.Second}).Result()
		if err != nil {
			return
		}
		m := res[0].Messages[0]
		req, err := messages.DecodeAnsibleDeployMessage((&stream.Message{Values: m.Values}).Data())
		if err != nil {
			return
		}
		now := messages.FormatTime(time.Now())
		events := []messages.ProgressEvent{
			{Type: messages.EventRunStarted},
			{Type: messages.EventPlayStarted, Play: "Deploy"},
			{Type: messages.EventTaskStarted, Play: "Deploy", Task: "project_deploy : Check out the branch"},
			{Type: messages.EventHostChanged, Host: req.ServerIP, Task: "project_deploy : Check out the branch"},
			{Type: messages.EventRunFinished, Status: status},
		}
		for i := range events {
			e := &events[i]
			e.JobID, e.Seq, e.Time = req.JobID, int64(i+1), now
			data, _ := messages.Encode(e)
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindDeploy, req.JobID), Values: map[string]any{messages.DataField: data}})
		}
		r := messages.NewAnsibleDeployResult(req, m.ID)
		r.Status = status
		if status != messages.StatusSucceeded {
			r.Error = &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "task Check out the branch failed"}
		}
		data, _ := messages.Encode(r)
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamDeployResults, Values: map[string]any{messages.DataField: data}})
		got <- req
	}()
	return got
}

func TestDeployFollow(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	rcv := otlptest.Start()
	defer rcv.Close()
	env := map[string]string{"REDIS_URL": url, "OTEL_EXPORTER_OTLP_ENDPOINT": rcv.Endpoint()}
	const project = "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F"

	got := fakeDeployInfra(t, rdb, messages.StatusSucceeded)
	out, errOut, code := run(t, env, "deploy", project, "acme/shop", "::ffff:198.51.100.7", "--port", "8080", "--ssh-port", "2222",
		"-m", "nginx", "-m", "app", "--branch", "release/1.2", "--github-token-ref", "vault:secret/data/ci#token",
		"--time-limit", "10m", "--job-id", "dep-1", "--correlation-id", "ops-7", "--follow", "--timeout", "1m")
	if code != 0 {
		t.Fatalf("deploy --follow: exit %d\n%s%s", code, out, errOut)
	}
	req := <-got
	if req == nil || req.JobID != "dep-1" || req.ProjectID != strings.ToLower(project) || req.ServerIP != "198.51.100.7" ||
		req.Port != 8080 || req.SSHPort != 2222 || req.Branch != "release/1.2" || strings.Join(req.Modules, ",") != "nginx,app" ||
		req.GitHubTokenRef != "vault:secret/data/ci#token" || req.TimeoutSeconds != 600 || req.CorrelationID != "ops-7" || req.CreatedAt == "" {
		t.Fatalf("request on the queue: %+v", req)
	}
	for _, want := range []string{"queued job dep-1 (deploy acme/shop to 198.51.100.7", "play  Deploy",
		"task  project_deploy : Check out the branch", "198.51.100.7: changed", "result: succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// With an OTLP endpoint the request carries the context of autoprov's
	// producer span, which went to the collector.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spans, ok := rcv.WaitFor(ctx, func(s []otlptest.Span) bool { return len(s) > 0 })
	if !ok || spans[0].Name != "send "+messages.StreamAnsibleDeployQueue || spans[0].Service != "autoprov" ||
		!strings.Contains(req.Traceparent, spans[0].TraceID+"-"+spans[0].SpanID) {
		t.Errorf("spans %+v, request traceparent %q", spans, req.Traceparent)
	}

	// A failed job: exit 1, --json prints the result.
	rdb.Del(context.Background(), messages.StreamAnsibleDeployQueue)
	got = fakeDeployInfra(t, rdb, messages.StatusFailed)
	out, _, code = run(t, map[string]string{"REDIS_URL": url}, "--json", "deploy", project, "acme/shop", "198.51.100.7", "--port", "8080", "--follow", "--timeout", "1m")
	if code != 1 {
		t.Fatalf("deploy --follow of a failing job: exit %d\n%s", code, out)
	}
	req = <-got
	var res map[string]any
	mustJSON(t, out, &res)
	if res["status"] != "failed" || res["job_id"] != req.JobID || req.JobID == "" || req.Port != 8080 || req.SSHPort != 0 || req.Branch != "main" || req.Traced() {
		t.Fatalf("result %v for request %+v", res, req)
	}

	// Without --follow: the job id, the entry, and nothing waits.
	rdb.Del(context.Background(), messages.StreamAnsibleDeployQueue)
	out, _, code = run(t, map[string]string{"REDIS_URL": url}, "--json", "deploy", project, "acme/shop", "198.51.100.7", "--port", "8080")
	var queued map[string]string
	mustJSON(t, out, &queued)
	if code != 0 || queued["stream"] != messages.StreamAnsibleDeployQueue || queued["job_id"] == "" || queued["entry_id"] == "" {
		t.Fatalf("deploy: exit %d %v", code, queued)
	}

	// Mistakes are refused by the wire contract's rules before anything is
	// queued, with the field named; a token in place of a reference is not
	// echoed.
	rdb.Del(context.Background(), messages.StreamAnsibleDeployQueue)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"deploy", "not-a-uuid", "acme/shop", "198.51.100.7"}, "project_id"},
		{[]string{"deploy", project, "acme", "198.51.100.7"}, "repo_full_name"},
		{[]string{"deploy", project, "acme/shop", "web-1.example"}, "server_ip"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--port", "70000"}, "port"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--ssh-port", "70000"}, "ssh_port"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--ssh-port", "2222"}, "--port"}, // the app's port has no default
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--branch", "a..b"}, "branch"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "-m", "Bad Module"}, "modules[0]"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--secrets-ref", "ghp_supersecretvalue"}, "secrets_ref"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--time-limit", "48h"}, "timeout_seconds"},
		{[]string{"deploy", project, "acme/shop", "198.51.100.7", "--time-limit", "1500ms"}, "whole seconds"},
	} {
		if !slices.Contains(tc.args, "--port") && tc.want != "--port" {
			tc.args = append(tc.args, "--port", "8080")
		}
		_, errOut, code := run(t, map[string]string{"REDIS_URL": url}, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, want 2 naming %s:\n%s", tc.args, code, tc.want, errOut)
		}
		if strings.Contains(errOut, "ghp_supersecretvalue") {
			t.Errorf("%q: the error echoes the value:\n%s", tc.args, errOut)
		}
	}
	if n, _ := rdb.XLen(context.Background(), messages.StreamAnsibleDeployQueue).Result(); n != 0 {
		t.Fatalf("%d requests queued by refused commands", n)
	}
}

// TestFollowShowsEveryEventBeforeTheResult: a job's events are written
// before its result, but one read may list the result first (the order of
// streams in a reply follows the request) or hold only part of the events;
// follow prints them all before the result either way.
func TestFollowShowsEveryEventBeforeTheResult(t *testing.T) {
	t.Parallel()
	_, rdb := redisDB(t)
	ctx := context.Background()
	for i := range 32 {
		jobID := fmt.Sprintf("dep-order-%d", i)
		req := &messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerIP: "198.51.100.7"}
		events := []messages.ProgressEvent{
			{Type: messages.EventPlayStarted, Play: "Deploy"},
			{Type: messages.EventTaskStarted, Task: "Check out"},
			{Type: messages.EventHostChanged, Host: req.ServerIP, Task: "Check out"},
			{Type: messages.EventRunFinished, Status: messages.StatusSucceeded},
		}
		for n := range events {
			e := &events[n]
			e.JobID, e.Seq, e.Time = jobID, int64(n+1), messages.FormatTime(time.Now())
			data, err := messages.Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindDeploy, jobID), Values: map[string]any{messages.DataField: data}})
		}
		r := messages.NewAnsibleDeployResult(req, "1-0")
		r.Status = messages.StatusSucceeded
		data, err := messages.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: messages.StreamDeployResults, Values: map[string]any{messages.DataField: data}})

		var out, errOut bytes.Buffer
		g := &globals{ctx: ctx, env: Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}}
		// The kind is not known (as for `follow JOB`): every kind's streams are read.
		from := map[messages.JobKind]string{messages.JobKindProvision: "0-0", messages.JobKindDeploy: "0-0"}
		if err := follow(g, rdb, jobID, from, 30*time.Second); err != nil {
			t.Fatalf("follow %s: %v\n%s", jobID, err, errOut.String())
		}
		text := out.String()
		last := -1
		for _, want := range []string{"play  Deploy", "task  Check out", "198.51.100.7: changed", "run finished: succeeded", "result: succeeded"} {
			at := strings.Index(text, want)
			if at < 0 || at < last {
				t.Fatalf("%s: %q missing or out of order:\n%s", jobID, want, text)
			}
			last = at
		}
		if strings.Count(text, "198.51.100.7: changed") != 1 {
			t.Fatalf("%s: an event printed twice:\n%s", jobID, text)
		}
		rdb.Del(ctx, messages.StreamDeployResults)
	}
}

// TestDeployHelpNamesThePorts keeps the two ports apart in the help: --port
// is the application's port (what the deploy playbook publishes), --ssh-port
// the SSH port of an unregistered target.
func TestDeployHelpNamesThePorts(t *testing.T) {
	t.Parallel()
	out, errOut, code := run(t, nil, "deploy", "--help")
	help := strings.Join(strings.Fields(out+errOut), " ")
	for _, want := range []string{
		"--port=INT the application's port", "handed to the deploy playbook", "(not the SSH port)",
		"--ssh-port=INT SSH port of a target that is not a registered server (default 22)",
	} {
		if code != 0 || !strings.Contains(help, want) {
			t.Errorf("deploy --help: exit %d, lacks %q:\n%s", code, want, out+errOut)
		}
	}
}
