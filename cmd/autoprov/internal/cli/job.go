package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// provisionCmd enqueues a ProvisionerMessage, as the scheduler does.
type provisionCmd struct {
	Server    string        `arg:"" help:"handle of the registered server"`
	Recovery  bool          `xor:"mode" help:"recover the server (no reinstall)"`
	Reinstall bool          `xor:"mode" help:"reinstall the operating system first"`
	JobID     string        `name:"job-id" help:"the job id (default: a new UUID); the same id twice is one job"`
	Follow    bool          `help:"print the job's progress live and exit with its status (0 succeeded, 1 otherwise)"`
	Timeout   time.Duration `default:"1h" help:"with --follow: give up waiting after this long"`
}

func (c *provisionCmd) Run(g *globals) error {
	msg := &messages.ProvisionerMessage{
		RequestMeta:  newMeta(c.JobID, ""),
		ServerHandle: c.Server, IsRecovery: c.Recovery, ForceReinstall: c.Reinstall,
	}
	if err := msg.Validate(); err != nil {
		return usageError{err}
	}
	return enqueue(g, request{
		kind: messages.JobKindProvision, queue: messages.StreamProvisionerQueue,
		jobID: msg.JobID, what: "provision " + c.Server, follow: c.Follow, timeout: c.Timeout,
		encode: func(tc messages.TraceContext) ([]byte, error) {
			msg.TraceContext = tc
			return messages.Encode(msg)
		},
	})
}

// newMeta returns the keys every request gets: schema version, the job id
// (a new UUID when none is given), correlation id and creation time.
func newMeta(jobID, correlationID string) messages.RequestMeta {
	if jobID == "" {
		jobID = uuid.NewString()
	}
	return messages.RequestMeta{
		SchemaVersion: messages.SchemaVersion,
		JobID:         jobID,
		CorrelationID: correlationID,
		CreatedAt:     messages.FormatTime(time.Now()),
	}
}

// request is a validated request to enqueue.
type request struct {
	kind        messages.JobKind // names its results stream, progress stream and cancel key
	queue       string           // the stream it goes to
	jobID, what string
	follow      bool
	timeout     time.Duration
	// encode returns the request carrying the trace context tc.
	encode func(tc messages.TraceContext) ([]byte, error)
}

// enqueue appends the request to its queue (in a producer span whose
// context it carries, when OTEL_EXPORTER_OTLP_* sets up tracing), prints
// what was queued and, with follow, follows the job to its result.
func enqueue(g *globals, r request) error {
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	producer, err := g.producer(rdb)
	if err != nil {
		return err
	}
	tp, err := g.tracing()
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(g.ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			fmt.Fprintf(g.env.Stderr, "autoprov: %v\n", err)
		}
	}()
	// Where the results stream ends now: a fast result is not missed.
	from, err := lastID(g.ctx, rdb, resultsStream(r.kind))
	if err != nil {
		return err
	}
	ctx, span := tracing.StartPublish(g.ctx, tp, r.queue, attribute.String("autoprov.job_id", r.jobID))
	data, err := r.encode(tracing.Inject(ctx))
	if err != nil {
		tracing.End(span, err)
		return err
	}
	id, err := producer.Publish(ctx, r.queue, data)
	tracing.End(span, err)
	if err != nil {
		return err
	}
	if g.json && !r.follow {
		return writeJSON(g.env.Stdout, map[string]string{"job_id": r.jobID, "entry_id": id, "stream": r.queue})
	}
	if !g.json {
		fmt.Fprintf(g.env.Stdout, "queued job %s (%s, entry %s)\n", r.jobID, r.what, id)
	}
	if !r.follow {
		return nil
	}
	return follow(g, rdb, r.jobID, map[messages.JobKind]string{r.kind: from}, r.timeout)
}

// kindFlag is the --kind of the commands that name a job by its id alone:
// a job's progress stream and cancel key are named after its kind
// (messages.JobKind), which its id does not tell.
type kindFlag struct {
	Kind string `enum:"auto,provision,deploy,job" default:"auto" help:"the job's kind: provision, deploy, job, or auto (every kind: a job id is never used by two kinds)"`
}

// kinds returns the kinds to look at: the one named, or every kind.
func (f kindFlag) kinds() []messages.JobKind {
	if f.Kind == "auto" || f.Kind == "" {
		return messages.JobKinds()
	}
	return []messages.JobKind{messages.JobKind(f.Kind)}
}

// resultsStream returns the stream of the results of jobs of kind k.
func resultsStream(k messages.JobKind) string { return messages.ResultsStream(k) }

// followCmd prints a job's progress until it ends.
type followCmd struct {
	JobID   string        `arg:"" name:"job" help:"the job id"`
	Timeout time.Duration `default:"1h" help:"give up waiting after this long"`
	kindFlag
}

func (c *followCmd) Run(g *globals) error {
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	// The job may have ended already: its result is then in the recent
	// results (looked up first), else it comes after their current end.
	from := map[messages.JobKind]string{}
	for _, k := range c.kinds() {
		res, last, err := findResult(g.ctx, rdb, resultsStream(k), c.JobID)
		if err != nil {
			return err
		}
		if res != nil {
			printEvents(g, stream.NewJobs(rdb), k, c.JobID)
			return finish(g, res)
		}
		from[k] = last
	}
	return follow(g, rdb, c.JobID, from, c.Timeout)
}

// cancelCmd asks a running job to stop.
type cancelCmd struct {
	JobID string        `arg:"" name:"job" help:"the job id"`
	TTL   time.Duration `default:"24h" help:"how long the request stands (a job that starts later within it is cancelled too)"`
	kindFlag
}

func (c *cancelCmd) Run(g *globals) error {
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	jobs := stream.NewJobs(rdb)
	kinds, err := c.cancelKinds(g.ctx, jobs)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(kinds))
	for _, k := range kinds {
		key, err := jobs.Cancel(g.ctx, k, c.JobID, time.Now().UTC().Format(time.RFC3339), c.TTL)
		if err != nil {
			return err
		}
		keys = append(keys, key)
	}
	if g.json {
		return writeJSON(g.env.Stdout, map[string]any{"job_id": c.JobID, "cancel_keys": keys})
	}
	fmt.Fprintf(g.env.Stdout, "cancel requested for job %s (%s; the running play stops; the job ends as cancelled)\n",
		c.JobID, strings.Join(keys, ", "))
	return nil
}

// cancelKinds returns the kinds whose cancel key to set: the one named by
// --kind; else the kind of the job's progress stream when exactly one
// exists (the job has started); else every kind (a queued job's kind is
// not known here, and a job id is never used by two kinds).
func (c *cancelCmd) cancelKinds(ctx context.Context, jobs *stream.Jobs) ([]messages.JobKind, error) {
	kinds := c.kinds()
	if len(kinds) == 1 {
		return kinds, nil
	}
	var started []messages.JobKind
	for _, k := range kinds {
		ok, err := jobs.Started(ctx, k, c.JobID)
		if err != nil {
			return nil, fmt.Errorf("look up job %s: %w", c.JobID, err)
		}
		if ok {
			started = append(started, k)
		}
	}
	if len(started) == 1 {
		return started, nil
	}
	return kinds, nil
}

// jobResult is what ends a job: its status and the result's fields.
type jobResult struct {
	Stream string
	Status messages.Status
	Error  string
	Raw    map[string]any
}

// errJobFailed makes the exit status 1 after the result was printed.
var errJobFailed = &problemsFound{}

func finish(g *globals, r *jobResult) error {
	if g.json {
		if err := writeJSON(g.env.Stdout, r.Raw); err != nil {
			return err
		}
	} else {
		line := fmt.Sprintf("result: %s", r.Status)
		if r.Error != "" {
			line += ": " + r.Error
		}
		fmt.Fprintln(g.env.Stdout, line)
	}
	if r.Status != messages.StatusSucceeded {
		return errJobFailed
	}
	return nil
}

// follow prints the job's progress events and waits for its result, for
// each kind in from (the job's kind, or every kind when it is not known):
// the kind's progress stream from its start, its results stream after the
// id in from, read together (stream.Jobs.Read). A job whose run_finished
// event is read but whose result does not show within resultGrace of that
// event (consumed and trimmed from its stream already) ends with the
// event's status (see runEnd).
func follow(g *globals, rdb redis.UniversalClient, jobID string, from map[messages.JobKind]string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(g.ctx, timeout)
	defer cancel()
	jobs := stream.NewJobs(rdb)
	var cursors []stream.Cursor
	kinds := map[string]messages.JobKind{} // progress and results streams -> their kind
	progress := map[messages.JobKind]int{} // kind -> the index of its progress stream's cursor
	for k, id := range from {
		ev := messages.ProgressStream(k, jobID)
		progress[k] = len(cursors)
		cursors = append(cursors, stream.Cursor{Stream: ev, ID: "0-0"}, stream.Cursor{Stream: resultsStream(k), ID: id})
		kinds[ev], kinds[resultsStream(k)] = k, k
	}
	var end *runEnd // the job's run_finished event, once read
	for {
		if end.over() {
			return finishFromEvent(g, jobID, end.ev)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("job %s: no result within %s", jobID, timeout)
		}
		got, err := jobs.Read(ctx, cursors, stream.ReadArgs{Count: 100, Block: time.Second})
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("job %s: no result within %s", jobID, timeout)
		case err != nil:
			return fmt.Errorf("read job %s: %w", jobID, err)
		}
		for i, msgs := range got {
			for _, m := range msgs {
				cursors[i].ID = m.ID
				k := kinds[m.Stream]
				if i == progress[k] {
					if e, err := messages.DecodeProgressEvent(m.Data()); err == nil {
						showEvent(g, e)
						if e.Type == messages.EventRunFinished {
							end = endOf(ctx, jobs, m.ID, e)
						}
					}
					continue
				}
				if r := resultOf(m.Stream, m.Data(), jobID); r != nil {
					// The job's events were all written before its result,
					// but this reply may list them after it (or hold only
					// part of them): print the rest first.
					showEventsAfter(g, jobs, k, jobID, cursors[progress[k]].ID)
					return finish(g, r)
				}
			}
		}
	}
}

// printEvents prints the events a job of kind k left on its progress
// stream (for a job already over).
func printEvents(g *globals, jobs *stream.Jobs, k messages.JobKind, jobID string) {
	showEventsAfter(g, jobs, k, jobID, "0-0")
}

// showEventsAfter prints the job's progress events after entry id after.
func showEventsAfter(g *globals, jobs *stream.Jobs, k messages.JobKind, jobID, after string) {
	evs, err := jobs.Events(g.ctx, k, jobID, after, 0)
	if err != nil {
		return
	}
	for _, e := range evs {
		if e.Event != nil {
			showEvent(g, e.Event)
		}
	}
}

// showEvent prints one progress event (not with --json, whose output is
// the result alone).
func showEvent(g *globals, e *messages.ProgressEvent) {
	if g.json {
		return
	}
	w := g.env.Stdout
	switch {
	case e.Type == messages.EventPlayStarted:
		fmt.Fprintf(w, "play  %s\n", oneLine(e.Play))
	case e.Type == messages.EventTaskStarted:
		fmt.Fprintf(w, "  task  %s\n", oneLine(e.Task))
	case e.Type.HostEvent():
		line := fmt.Sprintf("        %s: %s", oneLine(e.Host), strings.TrimPrefix(string(e.Type), "host_"))
		if e.Message != "" && (e.Type == messages.EventHostFailed || e.Type == messages.EventHostUnreachable) {
			line += ": " + oneLine(e.Message)
		}
		fmt.Fprintln(w, line)
	case e.Type == messages.EventRunFinished:
		fmt.Fprintf(w, "run finished: %s\n", e.Status)
	default:
		fmt.Fprintf(w, "%s %s\n", e.Type, oneLine(e.Message))
	}
}

// resultOf decodes a result entry of stream and returns it when it is the
// job's.
func resultOf(s string, data []byte, jobID string) *jobResult {
	var o *messages.Outcome
	switch s {
	case messages.StreamProvisionerResults:
		r, err := messages.DecodeProvisionerResult(data)
		if err != nil {
			return nil
		}
		o = &r.Outcome
	case messages.StreamDeployResults:
		r, err := messages.DecodeAnsibleDeployResult(data)
		if err != nil {
			return nil
		}
		o = &r.Outcome
	default:
		return nil
	}
	if o.JobID != jobID {
		return nil
	}
	jr := &jobResult{Stream: s, Status: o.Status}
	if o.Error != nil {
		jr.Error = o.Error.Message
	}
	raw, _ := decodePayload(data).(map[string]any)
	delete(raw, "output_tail")
	jr.Raw = raw
	return jr
}

// findResult looks for the job's result among the last entries of a
// results stream and returns it, or nil and the stream's last id.
func findResult(ctx context.Context, rdb redis.UniversalClient, s, jobID string) (*jobResult, string, error) {
	msgs, err := rdb.XRevRangeN(ctx, s, "+", "-", 10000).Result()
	if err != nil {
		return nil, "", fmt.Errorf("xrevrange %s: %w", s, err)
	}
	last := "0-0"
	if len(msgs) > 0 {
		last = msgs[0].ID
	}
	for _, m := range msgs {
		if r := resultOf(s, (&stream.Message{Values: m.Values}).Data(), jobID); r != nil {
			return r, last, nil
		}
	}
	return nil, last, nil
}

// lastID returns the id of a stream's last entry ("0-0" when empty).
func lastID(ctx context.Context, rdb redis.UniversalClient, s string) (string, error) {
	msgs, err := rdb.XRevRangeN(ctx, s, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("xrevrange %s: %w", s, err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}
