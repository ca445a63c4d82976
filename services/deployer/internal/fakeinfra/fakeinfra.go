// Package fakeinfra is a small stand-in for the infra service in the
// deployer's tests: a consumer of ansible:deploy:queue (and of
// ansible:job:queue, answering Ansible jobs on job:results) (group "infra")
// that, like infra, records each job in the runs table (so a cancelled,
// never-started job is not run), publishes progress events on
// job:deploy:<id>:events, watches the job's cancel key, writes the run's output
// through pkg/runlog, and publishes an AnsibleDeployResult on
// deploy:results. What each job does is up to the test (Plan).
package fakeinfra

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
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
	// playbook_failed, any other Kind.
	Status messages.Status
	// Kind is the error kind of a run that did not succeed (default
	// playbook_failed); only playbook_failed names a failed task.
	Kind messages.ErrorKind
	// Output is the run's output (default: a line per task).
	Output string
	// EventMessage is put in each host event (to make events big).
	EventMessage string
	// TaskName names the tasks "<TaskName> <n>" (default "task").
	TaskName string
	// FailedHosts and UnreachableHosts are the hosts whose recap counts a
	// failure or an unreachable host (a job's status is Status still).
	FailedHosts, UnreachableHosts []string
	// Artifacts are a job's set_stats data, put in its result.
	Artifacts messages.Vars
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
	// JobQueue and JobResults, when set, are the streams of Ansible jobs
	// (AnsibleJobMessage) it answers too; JobPlanFor chooses their plans.
	JobQueue   string
	JobResults string
	JobPlanFor func(m *messages.AnsibleJobMessage) Plan

	mu      sync.Mutex
	started map[string]int // job id -> runs started
	jobs    []*messages.AnsibleJobMessage
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
	queues := []string{f.Queue}
	if f.JobQueue != "" {
		queues = append(queues, f.JobQueue)
	}
	c, err := stream.NewConsumer(f.Redis, stream.Config{
		Group: "infra", Streams: queues, Concurrency: 8, Block: 100 * time.Millisecond,
		Lease: 5 * time.Second, ShutdownGrace: time.Second,
	}, stream.HandlerFunc(f.handle))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func (f *Infra) handle(ctx context.Context, msg *stream.Message) error {
	if f.JobQueue != "" && msg.Stream == f.JobQueue {
		return f.handleJob(ctx, msg)
	}
	m, err := messages.DecodeAnsibleDeployMessage(msg.Data())
	res := messages.NewAnsibleDeployResult(m, msg.ID)
	if err != nil {
		res.Reject(err)
		res.SetTimes(time.Now(), time.Now())
		return f.publish(ctx, f.Results, res)
	}
	plan := Plan{Tasks: 1}
	if f.PlanFor != nil {
		plan = f.PlanFor(m)
	}
	return f.run(ctx, runSpec{
		msg: msg, kind: messages.JobKindDeploy, target: "address:" + m.ServerIP, playbook: "deploy_project.yml",
		play: "Deploy the project", hosts: []string{"srv-1"}, plan: plan, outcome: &res.Outcome,
		results: f.Results, result: res,
	})
}

// handleJob answers an Ansible job: its inline inventory's hosts (else one
// host) each change in every task.
func (f *Infra) handleJob(ctx context.Context, msg *stream.Message) error {
	m, err := messages.DecodeAnsibleJobMessage(msg.Data())
	res := messages.NewAnsibleJobResult(m, msg.ID)
	if err != nil {
		res.Reject(err)
		res.SetTimes(time.Now(), time.Now())
		return f.publish(ctx, f.JobResults, res)
	}
	f.mu.Lock()
	f.jobs = append(f.jobs, m)
	f.mu.Unlock()
	hosts := make([]string, 0, len(m.Inventory.Hosts))
	for h := range m.Inventory.Hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	if len(hosts) == 0 {
		hosts = []string{"host-1"}
	}
	playbook := "site.yml"
	if len(m.Source.Paths) > 0 {
		playbook = m.Source.Paths[0]
	}
	plan := Plan{Tasks: 1}
	if f.JobPlanFor != nil {
		plan = f.JobPlanFor(m)
	}
	res.Commit = strings.Repeat("ab", 20)
	res.Artifacts = plan.Artifacts
	return f.run(ctx, runSpec{
		msg: msg, kind: messages.JobKindJob, target: "job:" + m.JobID, playbook: playbook, play: "Run the job",
		hosts: hosts, plan: plan, outcome: &res.Outcome, results: f.JobResults, result: res,
		finish: func(status messages.Status, d time.Duration) {
			res.Playbooks = []messages.PlaybookOutcome{{Playbook: playbook, Status: messages.PlaybookStatus(status), DurationMS: d.Milliseconds()}}
		},
	})
}

// Jobs returns the Ansible job requests the stand-in read, in order.
func (f *Infra) Jobs() []*messages.AnsibleJobMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*messages.AnsibleJobMessage(nil), f.jobs...)
}

// runSpec is one request to run, of either kind.
type runSpec struct {
	msg      *stream.Message
	kind     messages.JobKind
	target   string
	playbook string
	play     string
	hosts    []string
	plan     Plan
	outcome  *messages.Outcome // of result
	results  string
	result   any // the wire result, published once outcome is set
	finish   func(status messages.Status, d time.Duration)
}

func (f *Infra) run(ctx context.Context, rs runSpec) error {
	res, plan := rs.outcome, rs.plan
	jobID := res.JobID
	run, started, err := store.StartRun(ctx, f.DB, store.RunStart{
		JobID: jobID, Kind: string(rs.kind), Stream: rs.msg.Stream, RequestID: rs.msg.ID,
		Target: rs.target, Playbook: rs.playbook, Owner: "fakeinfra",
	})
	if err != nil {
		return err
	}
	if !started {
		// Done already (finished, or cancelled before it started): publish
		// the stored result again, as infra does.
		_, err := f.Redis.XAdd(ctx, &redis.XAddArgs{Stream: rs.results, Values: map[string]any{messages.DataField: run.Result}}).Result()
		return err
	}
	f.mu.Lock()
	f.started[jobID]++
	f.mu.Unlock()

	if plan.Status == "" {
		plan.Status = messages.StatusSucceeded
	}
	started0 := time.Now()
	ev := &events{rdb: f.Redis, stream: messages.ProgressStream(rs.kind, jobID), jobID: jobID}
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventRunStarted, Message: "attempt 1 of " + rs.playbook})
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventPlayStarted, Play: rs.play})

	cancelled := false
	cancelKey := messages.CancelKey(rs.kind, jobID)
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
		task := fmt.Sprintf("%s %d", cmp.Or(plan.TaskName, "task"), i)
		ev.emit(ctx, messages.ProgressEvent{Type: messages.EventTaskStarted, Play: rs.play, Task: task})
		if plan.TaskDelay > 0 {
			time.Sleep(plan.TaskDelay)
		}
		fmt.Fprintf(&out, "TASK [%s] ***\n", task)
		for _, h := range rs.hosts {
			ev.emit(ctx, messages.ProgressEvent{Type: messages.EventHostChanged, Play: rs.play, Task: task, Host: h, Message: plan.EventMessage})
			fmt.Fprintf(&out, "changed: [%s]\n", h)
		}
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
	case cmp.Or(plan.Kind, messages.KindPlaybookFailed) == messages.KindPlaybookFailed:
		res.Fail(status, messages.KindPlaybookFailed, "a task failed")
		res.FailedTask = &messages.FailedTask{Name: cmp.Or(plan.TaskName, "task") + " 1", Host: rs.hosts[0], Play: rs.play, Message: "boom"}
	default:
		res.Fail(status, plan.Kind, "the run ended "+string(status))
	}
	res.Playbook = rs.playbook
	res.Hosts = map[string]messages.HostRecap{}
	for _, h := range rs.hosts {
		res.Hosts[h] = messages.HostRecap{Ok: 2, Changed: changed}
		switch {
		case status == messages.StatusUnreachable, slices.Contains(plan.UnreachableHosts, h):
			res.Hosts[h] = messages.HostRecap{Unreachable: 1}
		case slices.Contains(plan.FailedHosts, h):
			res.Hosts[h] = messages.HostRecap{Ok: 1, Failed: 1}
		}
	}
	output := plan.Output
	if output == "" {
		output = out.String()
	}
	res.SetOutputTail(output)
	res.SetTimes(started0, time.Now())
	if rs.finish != nil {
		rs.finish(status, time.Since(started0))
	}
	if f.Logs != nil {
		if _, err := f.Logs.Put(ctx, jobID, strings.NewReader(output)); err != nil {
			return err
		}
	}
	ev.emit(ctx, messages.ProgressEvent{Type: messages.EventRunFinished, Status: status, Message: string(status)})
	data, err := messages.Encode(rs.result)
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
	return f.publish(ctx, rs.results, rs.result)
}

func (f *Infra) publish(ctx context.Context, stream string, res any) error {
	data, err := messages.Encode(res)
	if err != nil {
		return err
	}
	return f.Redis.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{messages.DataField: data}}).Err()
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
