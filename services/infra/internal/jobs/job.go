package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Run kinds, as stored in runs.kind; the same words as the job kinds that
// name a job's progress stream and cancel key (messages.JobKind).
const (
	kindProvision = string(messages.JobKindProvision)
	kindDeploy    = string(messages.JobKindDeploy)
)

var (
	// errLockLost cancels a run whose Postgres session (and with it the
	// server lock) died: the play must stop, another attempt will follow.
	errLockLost = errors.New("run locks lost (Postgres connection died)")
	// errUserCancel cancels a run whose cancel key was set.
	errUserCancel = errors.New("cancelled on request")
)

// job is one request being handled.
type job struct {
	h            *Handler
	msg          *stream.Message
	kind         string
	id           string
	log          zerolog.Logger
	out          *messages.Outcome // the result's common part: written only by record and reject
	result       any               // *messages.ProvisionerResult or *messages.AnsibleDeployResult
	resultStream string
	started      time.Time
	pgTrips      func() int64 // Postgres round trips of the job so far (store.CountRoundTrips)

	server   *store.Server     // nil for a deploy to an unregistered address
	targets  []string          // an Ansible job's hosts' lock keys (runLocked takes them all)
	run      *store.Run        // set once the run row is ours
	playbook string            // what the run is for (result.playbook unless a play says otherwise)
	red      *secrets.Redactor // this job's secrets; released when the job ends
	res      *secrets.Resolver // the service's own references; resolves into red
	project  *secrets.Resolver // the request's references; resolves into red
	prog     *progress         // nil until the run starts
	runOut   *runOutput        // the run's full output, on its way to the run log store
	// timeoutCap is the request's own time limit (timeout_seconds); 0: none.
	timeoutCap time.Duration

	// Timings of the service's own overhead (see play and complete).
	sshCheck       time.Duration // the SSH check before the play
	sshCheckReused bool          // a check that passed moments ago stood in for it
	lockWait       time.Duration // waiting for another run on the server
	playStarted    time.Time     // first ansible-playbook exec
	playEnded      time.Time     // when the last ansible-playbook exited
	steps          steps         // the job's time per step

	span trace.Span // the job's span (startTrace); nil before
}

func (h *Handler) newJob(msg *stream.Message, kind string, result any, out *messages.Outcome, resultStream string) *job {
	red := h.Redactor.Child()
	j := &job{
		h:            h,
		msg:          msg,
		kind:         kind,
		id:           out.JobID,
		log:          h.Log.With().Str("job_id", out.JobID).Str("msg_id", msg.ID).Str("kind", kind).Int64("delivery", msg.Deliveries).Logger(),
		out:          out,
		result:       result,
		resultStream: resultStream,
		started:      h.Now(),
		red:          red,
		res:          h.Secrets.WithRedactor(red),
		project:      h.Project.WithRedactor(red),
	}
	if msg.Pickup > 0 {
		j.steps.set(stepPickup, msg.Pickup)
	}
	return j
}

// close drops an output not stored and releases the job's secrets.
func (j *job) close() {
	j.endTrace()
	j.dropOutput()
	j.red.Release()
}

// reasonTargetRefused is the dead-letter reason of a provisioning request
// whose server is at an address no run may reach (authz.Guard).
const reasonTargetRefused = "target_refused"

// reject publishes a rejected result for invalid input and dead-letters the
// entry.
func (j *job) reject(ctx context.Context, err error) error {
	return j.rejectAs(ctx, string(messages.KindInvalidMessage), err)
}

// rejectAs is reject with the dead-letter reason.
func (j *job) rejectAs(ctx context.Context, reason string, err error) error {
	j.log.Warn().Err(err).Str("reason", reason).Msg("request rejected")
	j.out.Reject(err)
	j.out.SetTimes(j.started, j.h.Now())
	if perr := j.publish(ctx); perr != nil {
		return perr // retried; dead-lettered at the limit anyway
	}
	j.h.Metrics.finished(j.kind, "", messages.StatusRejected, 0)
	return stream.Permanent(reason, err)
}

// end publishes the outcome of a request that never got as far as a run (no
// run row, no locks), e.g. an unknown server.
func (j *job) end(ctx context.Context, o *outcome) error {
	j.log.Warn().Str("error_kind", string(o.kind)).Str("reason", j.red.RedactString(o.message)).Msg("request failed before a run")
	j.record(o)
	if err := j.publish(ctx); err != nil {
		return err
	}
	j.h.Metrics.finished(j.kind, "", o.status, 0)
	return nil
}

// runLocked runs body as the job's run: it re-publishes a stored result,
// leaves the request pending (stream.Later) while its job runs elsewhere,
// takes the job and target locks (waiting out a Postgres outage), and
// records and publishes the outcome body returns (as a value or as an
// error). Any other error body returns is an infrastructure failure or an
// interruption: the run is handed over, retried or, on the last delivery,
// failed.
// waitBusy answers a request whose target another run holds: it waits
// outside the handler slots, released for redelivery without counting a
// delivery, and looks again after BusyRecheck, on whichever instance
// claims it then.
//
// It first joins the line of each of its targets (store.JoinLines), or
// keeps its place there: runs start in arrival order per target. A waiter
// with others before it looks again after BehindRecheck instead: the run
// ending before its turn hands it its slot (handOff).
func (j *job) waitBusy(ctx context.Context, target string, err error) error {
	delay := cmp.Or(j.h.cfg.BusyRecheck, time.Second)
	targets := j.lineTargets(target)
	behind, jerr := store.JoinLines(ctx, j.h.DB, store.Waiter{Job: j.id, Stream: j.msg.Stream, Entry: j.msg.ID}, targets)
	if jerr != nil {
		j.log.Warn().Err(jerr).Msg("could not join the lines of the busy targets: waiting without a place")
	}
	if behind && j.h.cfg.BehindRecheck > delay {
		// A waiter that came first starts before it, and the runs that
		// free its targets hand their slot to the first in line: looking
		// often would only cost the machine (an inventory, a probe).
		delay = j.h.cfg.BehindRecheck
	}
	j.log.Info().Str("target", target).Dur("recheck_in", delay).
		Msg("waiting for another run on this server to finish (outside the handler slots)")
	return stream.Later(delay, err)
}

// lineTargets is what the job waits in line for: its hosts' targets (an
// Ansible job's), else the one target of its run.
func (j *job) lineTargets(target string) []string {
	if len(j.targets) > 0 {
		return j.targets
	}
	return []string{target}
}

// handOff hands the handler's slot, once the handler returned, to the
// first waiter in the lines of the targets this run just freed (see
// waitBusy): it starts now, not when its recheck comes. A waiter of
// another stream, or one this instance does not read, is left to its
// recheck.
func (j *job) handOff(ctx context.Context, target string) {
	targets := j.lineTargets(target)
	heads, err := store.LineHeads(ctx, j.h.DB, targets, j.id)
	if err != nil {
		j.log.Warn().Err(err).Msg("could not read who waits for the freed servers: they look again at their recheck")
		return
	}
	entries := make([]stream.Entry, 0, len(heads))
	for _, w := range heads {
		entries = append(entries, stream.Entry{Stream: w.Stream, ID: w.Entry})
	}
	stream.HandOff(ctx, entries...)
}

func (j *job) runLocked(ctx context.Context, target, playbook string, body func(ctx context.Context) (*outcome, error)) error {
	db := j.h.DB
	at := time.Now()
	var r *store.Run
	err := j.durably(ctx, "read run", 30*time.Second, func(ctx context.Context) (err error) {
		r, err = store.GetRun(ctx, db, j.id)
		return err
	})
	if err == nil && r.Kind != j.kind {
		return j.kindConflict(ctx, r)
	} else if err == nil && r.State == store.RunDone {
		return j.republish(ctx, r)
	} else if err != nil && !errors.Is(err, store.ErrRunNotFound) {
		return j.infraError(ctx, fmt.Errorf("read run: %w", err))
	}

	at = j.steps.add(stepRunRecord, at)
	var locks *store.RunLocks
	lctx, lockSpan := j.startSpan(ctx, spanLock, attribute.String("autoprov.target", target))
	err = j.durably(lctx, "take run locks", 30*time.Second, func(ctx context.Context) (err error) {
		// Neither lock is waited for: a request for a busy server must not
		// hold one of the handler slots (CONCURRENCY) that runs on other
		// servers need while it waits.
		opts := store.LockOptions{PingInterval: j.h.cfg.LockCheck, Lease: j.h.cfg.LockLease, NoWait: true}
		if len(j.targets) > 0 {
			locks, err = j.h.Locker.AcquireAll(ctx, j.id, j.targets, opts)
			return err
		}
		locks, err = j.h.Locker.Acquire(ctx, j.id, target, opts)
		return err
	})
	if errors.Is(err, store.ErrTargetBusy) {
		// The request waits outside the slots: released for redelivery
		// without counting a delivery, it looks again after BusyRecheck,
		// on whichever instance claims it then.
		lockSpan.SetAttributes(attribute.Bool("autoprov.target_busy", true))
		endSpan(lockSpan, nil)
		return j.waitBusy(ctx, target, err)
	}
	endSpan(lockSpan, err)
	if errors.Is(err, store.ErrJobRunningElsewhere) {
		// Its outcome is not durable yet, and whoever runs it may still die,
		// drain or lose its lease: the request stays pending and comes back
		// until the run is done (then its stored result is published).
		delay := cmp.Or(j.h.cfg.ElsewhereRecheck, 5*time.Second)
		j.log.Info().Dur("recheck_in", delay).Msg("job is running on another instance: checking again later")
		return stream.Later(delay, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return j.infraError(ctx, fmt.Errorf("acquire run locks: %w", err))
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if locks.Release(rctx) == nil {
			j.handOff(rctx, target)
		}
	}()
	j.lockWait = locks.Waited()
	at = j.steps.add(stepLocks, at)

	start := store.RunStart{
		JobID: j.id, Kind: j.kind, Stream: j.msg.Stream, RequestID: j.msg.ID,
		Target: target, Playbook: playbook, Owner: j.h.cfg.Owner,
	}
	if j.server != nil {
		start.ServerHandle = j.server.Handle
	}
	j.playbook = playbook
	var run *store.Run
	var started bool
	err = j.durably(ctx, "start run", 30*time.Second, func(ctx context.Context) (err error) {
		run, started, err = store.StartRun(ctx, db, start)
		return err
	})
	if errors.Is(err, store.ErrJobKindConflict) {
		return j.kindConflict(ctx, run)
	}
	if err != nil {
		return j.infraError(ctx, fmt.Errorf("start run: %w", err))
	}
	if !started {
		return j.republish(ctx, run) // finished while we waited for the locks
	}
	j.run = run
	if run.Attempt > 1 {
		j.log.Warn().Int("attempt", run.Attempt).Msg("taking over a run whose previous owner stopped")
	}

	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-locks.Lost():
			cancel(errLockLost)
		case <-rctx.Done():
		}
	}()
	stopWatch := j.h.watchCancel(rctx, messages.JobKind(j.kind), j.id, cancel)
	defer stopWatch()

	j.h.Metrics.inFlight.Inc()
	defer j.h.Metrics.inFlight.Dec()
	j.prog = j.h.startProgress(messages.JobKind(j.kind), j.id, j.log)
	j.prog.emit(messages.ProgressEvent{Type: messages.EventRunStarted, Message: fmt.Sprintf("attempt %d of %s", run.Attempt, playbook)})
	j.steps.add(stepRunRecord, at)

	o, err := body(rctx)
	if end, ok := asOutcome(err); ok {
		o, err = end, nil
	}

	// A play that finished has an outcome that stands, whatever happened
	// around it meanwhile; only an interrupted run is handed over or retried.
	cause := context.Cause(rctx)
	interrupted := o == nil || o.status == messages.StatusCancelled
	switch {
	case stream.LeaseLost(ctx):
		// Another consumer owns the entry now: publish nothing.
		j.prog.abandon()
		return cause
	case err == nil && !interrupted:
	case errors.Is(cause, stream.ErrShutdown):
		// The entry is released to another instance, which takes the run
		// over; the server stays as it is until then.
		j.log.Warn().Msg("run interrupted by shutdown: handing it over")
		j.prog.abandon()
		return cause
	case errors.Is(cause, errLockLost):
		return j.infraError(ctx, errLockLost)
	case errors.Is(cause, errUserCancel):
		o = cancelledOnRequest(o)
	case err != nil:
		return j.infraError(ctx, err)
	case o == nil:
		return j.infraError(ctx, errors.New("the run ended without an outcome"))
	}
	return j.complete(ctx, o)
}

// complete records o, stores it with the run and the server's new state in
// one transaction, then publishes it. A crash between the two is mended by
// the redelivery, which finds the stored result and publishes it again.
func (j *job) complete(ctx context.Context, o *outcome) error {
	ctx = context.WithoutCancel(ctx)
	j.record(o)
	data, err := messages.Encode(j.result)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	kind := ""
	if j.out.Error != nil {
		kind = string(j.out.Error.Kind)
	}
	// The full output is stored before the result goes out, so that a
	// client reading the result finds the log.
	at := time.Now()
	j.storeOutput()
	at = j.steps.add(stepLogStore, at)
	// The progress stream's end goes out while the outcome is stored, and
	// before the result: a reader that sees the result (autoprov --follow,
	// the deployer's event streams) then finds every event of the run.
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		j.prog.finish(j.out.Status, j.outcomeLine())
	}()
	// A Postgres outage is waited out: the outcome stands, and only a
	// stored outcome is ever published.
	err = j.durably(ctx, "record result", 30*time.Second, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, j.h.DB, func(tx pgx.Tx) error {
			if j.run != nil {
				if err := store.FinishRun(ctx, tx, j.id, j.run.Attempt, string(j.out.Status), kind, data); err != nil {
					return err
				}
			}
			return j.recordServerOutcome(ctx, tx)
		})
	})
	<-progressDone
	if errors.Is(err, store.ErrRunDone) {
		// Stored already: by this try, whose commit was cut off before
		// its answer arrived, or by another owner. Either way the stored
		// result is the job's one result.
		r, gerr := store.GetRun(ctx, j.h.DB, j.id)
		if gerr != nil {
			return fmt.Errorf("record result: %w (read it back: %w)", err, gerr)
		}
		return j.republish(ctx, r)
	}
	if err != nil {
		return fmt.Errorf("record result: %w", err)
	}
	if err := j.publishData(ctx, data); err != nil {
		return err
	}
	j.steps.add(stepResult, at)
	published := j.h.Now()
	j.h.Metrics.finished(j.kind, j.out.Playbook, j.out.Status, time.Duration(j.out.DurationMS)*time.Millisecond)
	ev := j.log.Info().Str("status", string(j.out.Status)).Str("playbook", j.out.Playbook).
		Int64("duration_ms", j.out.DurationMS).Str("error_kind", kind)
	if !j.playStarted.IsZero() {
		// The service's own overhead around the play: from reading the
		// request to starting ansible-playbook (SSH check included, and
		// reported on its own), and from the play's end to the published
		// result.
		start, finish := j.playStarted.Sub(j.started), published.Sub(j.playEnded)
		j.h.Metrics.overhead.WithLabelValues("start").Observe(start.Seconds())
		j.h.Metrics.overhead.WithLabelValues("finish").Observe(finish.Seconds())
		ev = ev.Float64("overhead_start_ms", ms(start)).Float64("ssh_check_ms", ms(j.sshCheck)).Bool("ssh_check_reused", j.sshCheckReused).
			Float64("lock_wait_ms", ms(j.lockWait)).Float64("overhead_finish_ms", ms(finish))
	}
	if j.pgTrips != nil {
		ev = ev.Int64("pg_round_trips", j.pgTrips())
	}
	j.steps.observe(j.h.Metrics)
	j.steps.log(ev).Msg("job finished")
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// outcomeLine is a one-line summary for the progress stream.
func (j *job) outcomeLine() string {
	if j.out.Error == nil {
		return string(j.out.Status)
	}
	return string(j.out.Status) + ": " + j.out.Error.Message
}

// recordServerOutcome makes the transition the outcome causes, in tx (the
// transaction storing the run), through fleet.RecordRun: provisioning runs
// end READY (attempts reset), FAILED or UNREACHABLE (attempts + 1); a
// deploy that found the server down marks it UNREACHABLE. An ORPHANED
// server keeps its status. The scheduler completes its own part (retries,
// backoff, notification) when the result reaches it, without a second
// transition.
func (j *job) recordServerOutcome(ctx context.Context, tx pgx.Tx) error {
	if j.server == nil {
		return nil
	}
	kind := fleet.DeployRun
	r := fleet.Result{Handle: j.server.Handle, JobID: j.id, Status: j.out.Status}
	if res, ok := j.result.(*messages.ProvisionerResult); ok && j.kind == kindProvision {
		kind, r = fleet.ProvisionRun, fleet.ResultOf(res)
	} else if j.out.Error != nil {
		r.Error, r.ErrorKind = j.out.Error.Message, j.out.Error.Kind
	}
	moved, err := j.h.fleet().RecordRun(ctx, tx, r, kind, fleetActor)
	if err != nil {
		return err
	}
	if moved && j.out.Status == messages.StatusUnreachable {
		j.h.Metrics.unreachable.Inc()
	}
	return nil
}

// kindConflict rejects a request whose job id is already the id of a job
// of another kind: a job id names one job, and the other job's result must
// not be published as this one's.
func (j *job) kindConflict(ctx context.Context, r *store.Run) error {
	return j.end(ctx, fail(messages.StatusRejected, messages.KindInvalidMessage,
		"job_id %q is already the id of a %s job; use a new job_id", j.id, r.Kind))
}

// republish publishes a stored result again (a redelivered request).
func (j *job) republish(ctx context.Context, r *store.Run) error {
	j.log.Info().Str("status", r.Status).Msg("job already done: publishing its stored result again")
	// It may have waited in lines before it was done elsewhere (cancelled
	// while it waited): leave them, so that the runs behind it need not
	// wait for its place to go stale.
	if err := store.LeaveLines(ctx, j.h.DB, j.id); err != nil {
		j.log.Warn().Err(err).Msg("could not leave the lines: its places go stale")
	}
	return j.publishData(ctx, r.Result)
}

func (j *job) publish(ctx context.Context) error {
	data, err := messages.Encode(j.result)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	return j.publishData(ctx, data)
}

// publishData publishes a result. It waits out a Redis outage for up to
// RedisOutageWait (the Producer's retries), even when the job's context
// ends: the result is stored, and publishing it is what lets the request
// be acknowledged.
func (j *job) publishData(ctx context.Context, data []byte) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second+j.h.cfg.RedisOutageWait)
	defer cancel()
	ctx, span := j.startSpan(ctx, spanPublish, attribute.String("messaging.destination.name", j.resultStream))
	_, err := j.h.Producer.Publish(ctx, j.resultStream, data)
	endSpan(span, err)
	if err != nil {
		return fmt.Errorf("publish result: %w", err)
	}
	return nil
}

// infraError handles an infrastructure failure: it is returned (the stream
// runtime redelivers the entry after a backoff) unless this was the last
// allowed delivery, in which case the job fails with kind internal.
func (j *job) infraError(ctx context.Context, err error) error {
	msg := j.red.RedactString(err.Error())
	if isOutage(err) {
		// Postgres was unreachable for longer than the outage wait (or the
		// run's lock session died with it): nothing failed that another
		// delivery cannot do, so the job does not fail and the delivery
		// does not count.
		delay := cmp.Or(j.h.cfg.ElsewhereRecheck, 5*time.Second)
		j.log.Warn().Str("error", msg).Dur("retry_in", delay).Msg("Postgres unreachable: the request will be retried")
		j.prog.abandon()
		return stream.Later(delay, err)
	}
	if !j.h.lastDelivery(j.msg) {
		j.log.Warn().Str("error", msg).Msg("infrastructure error: the request will be retried")
		j.prog.abandon() // the next attempt publishes its own events
		return err
	}
	j.log.Error().Str("error", msg).Msg("infrastructure error on the last delivery: failing the job")
	o := fail(messages.StatusFailed, messages.KindInternal, "gave up after %d deliveries: %s", j.msg.Deliveries, msg)
	if cerr := j.complete(ctx, o); cerr != nil {
		// A result that is not stored is never published: another
		// delivery could store (and publish) a different one.
		if isOutage(cerr) {
			return stream.Later(cmp.Or(j.h.cfg.ElsewhereRecheck, 5*time.Second), errors.Join(err, cerr))
		}
		return errors.Join(err, cerr)
	}
	return nil
}
