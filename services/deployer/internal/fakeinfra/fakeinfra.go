// Package fakeinfra is a small stand-in for the infra service in the
// deployer's tests: a consumer of ansible:deploy:queue (group "infra")
// that, like infra, records each job in the runs table (so a cancelled,
// never-started job is not run), publishes progress events on
// job:deploy:<id>:events, watches the job's cancel key, writes the run's output
// through pkg/runlog, and publishes an AnsibleDeployResult on
// deploy:results. What each job does is up to the test (Plan).
package fakeinfra

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Plan is what a job does.
type Plan struct {
	// Tasks is the number of tasks run, each with a host_changed event.
	Tasks int
	// TaskDelay is how long each task takes.
	TaskDelay time.Duration
	// Hold, when set, blocks the job after run_started until it is closed
	// or the job is cancelled.
	Hold <-chan struct{}
	// Status is the final status (default succeeded); failed gives kind
	// playbook_failed.
	Status messages.Status
	// Output is the run's output (default: a line per task).
	Output string
	// EventMessage is put in each host event (to make events big).
	EventMessage string
}

// Infra is the stand-in.
type Infra struct {
	DB      *pgxpool.Pool
	Redis   redis.UniversalClient
	Queue   string
	Results string
	Logs    runlog.Store // nil: no logs written
	// PlanFor chooses the plan of a job; nil means one quick task.
	PlanFor func(m *messages.AnsibleDeployMessage) Plan

	mu      sync.Mutex
	started map[string]int // job id -> runs started
}

// Started returns how many times the job was run (not republished).
func (f *Infra) Started(jobID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started[jobID]
}

// Run consumes until ctx is done.
func (f *Infra) Run(ctx context.Context) error {
	f.mu.Lock()
	f.started = map[string]int{}
	f.mu.Unlock()
	c, err := stream.NewConsumer(f.Redis, stream.Config{
		Group: "infra", Streams: []string{f.Queue}, Concurrency: 8, Block: 100 * time.Millisecond,
		Lease: 5 * time.Second, ShutdownGrace: time.Second,
	}, stream.HandlerFunc(f.handle))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func (f *Infra) handle(ctx context.Context, msg *stream.Message) error {
	m, err := messages.DecodeAnsibleDeployMessage(msg.Data())
	res := messages.NewAnsibleDeployResult(m, msg.ID)
	if err != nil {
		res.Reject(err)
		res.SetTimes(time.Now(), time.Now())
		return f.publish(ctx, res)
	}
	jobID := res.JobID
	run, started, err := store.StartRun(ctx, f.DB, store.RunStart{
		JobID: jobID, Kind: store.RunDeploy, Stream: msg.Stream, RequestID: msg.ID,
		Target: "address:" + m.ServerIP, Playbook: "deploy_project.yml", Owner: "fakeinfra",
	})
	if err != nil {
		return err
	}
	if !started {
		// Done already (finished, or cancelled before it started): publish
		// the stored result again, as infra does.
		_, err := f.Redis.XAdd(ctx, &redis.XAddArgs{Stream: f.Results, Values: map[string]any{messages.DataField: run.Result}}).Result()
		return err
	}
	f.mu.Lock()
	f.started[jobID]++
	f.mu.Unlock()

	plan := Plan{Tasks: 1}
	if f.PlanFor != nil {
		plan = f.PlanFor(m)
	}
	if plan.Status == "" {
		plan.Status = messages.StatusSucceeded
	}
	started0 := time.Now()
	ev := &events{rdb: f.Redis, stream: messages.ProgressStream(messages.JobKindDeploy, jobID), jobID: jobID}
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventRunStarted, Message: "attempt 1 of deploy_project.yml"})
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventPlayStarted, Play: "Deploy the project"})

	cancelled := false
	cancelKey := messages.CancelKey(messages.JobKindDeploy, jobID)
	isCancelled := func() bool {
		n, _ := f.Redis.Exists(ctx, cancelKey).Result()
		return n > 0
	}
	if plan.Hold != nil {
		t := time.NewTicker(20 * time.Millisecond)
	hold:
		for {
			select {
			case <-plan.Hold:
				break hold
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
				if isCancelled() {
					cancelled = true
					break hold
				}
			}
		}
		t.Stop()
	}
	var out strings.Builder
	changed := 0
	for i := 1; i <= plan.Tasks && !cancelled; i++ {
		task := fmt.Sprintf("task %d", i)
		ev.emit(ctx, messages.ProgressEvent{Type: messages.EventTaskStarted, Play: "Deploy the project", Task: task})
		if plan.TaskDelay > 0 {
			time.Sleep(plan.TaskDelay)
		}
		ev.emit(ctx, messages.ProgressEvent{Type: messages.EventHostChanged, Play: "Deploy the project", Task: task, Host: "srv-1", Message: plan.EventMessage})
		fmt.Fprintf(&out, "TASK [%s] ***\nchanged: [srv-1]\n", task)
		changed++
		cancelled = isCancelled()
	}
	status := plan.Status
	switch {
	case cancelled:
		res.Fail(messages.StatusCancelled, messages.KindCancelled, "cancelled on request")
		status = messages.StatusCancelled
	case status == messages.StatusSucceeded:
		res.Succeed()
	default:
		res.Fail(status, messages.KindPlaybookFailed, "a task failed")
		res.FailedTask = &messages.FailedTask{Name: "task 1", Host: "srv-1", Play: "Deploy the project", Message: "boom"}
	}
	res.Playbook = "deploy_project.yml"
	res.Hosts = map[string]messages.HostRecap{"srv-1": {Ok: 2, Changed: changed}}
	output := plan.Output
	if output == "" {
		output = out.String()
	}
	res.SetOutputTail(output)
	res.SetTimes(started0, time.Now())
	if f.Logs != nil {
		if _, err := f.Logs.Put(ctx, jobID, strings.NewReader(output)); err != nil {
			return err
		}
	}
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventRunFinished, Status: status, Message: string(status)})
	data, err := messages.Encode(res)
	if err != nil {
		return err
	}
	kind := ""
	if res.Error != nil {
		kind = string(res.Error.Kind)
	}
	if err := store.FinishRun(ctx, f.DB, jobID, run.Attempt, string(res.Status), kind, data); err != nil {
		return err
	}
	return f.publish(ctx, res)
}

func (f *Infra) publish(ctx context.Context, res *messages.AnsibleDeployResult) error {
	data, err := messages.Encode(res)
	if err != nil {
		return err
	}
	return f.Redis.XAdd(ctx, &redis.XAddArgs{Stream: f.Results, Values: map[string]any{messages.DataField: data}}).Err()
}

type events struct {
	rdb    redis.UniversalClient
	stream string
	jobID  string
	seq    int64
}

func (e *events) emit(ctx context.Context, ev messages.ProgressEvent) {
	e.seq++
	ev.JobID, ev.Seq, ev.Time = e.jobID, e.seq, messages.FormatTime(time.Now())
	data, err := messages.Encode(&ev)
	if err != nil {
		panic(err)
	}
	e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.stream, Values: map[string]any{messages.DataField: data}})
}
