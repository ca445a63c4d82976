package ansible

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// timings are CLOCK_MONOTONIC nanoseconds of a run's milestones, for the
// overhead benchmark.
type timings struct {
	runCalled    int64 // Run entered
	takeover     int64 // the takeover's SSH session and script took this long (ns)
	spawning     int64 // exec.Cmd.Start called
	spawned      int64 // exec.Cmd.Start returned (guard or playbook started)
	guardMain    int64 // runguard's main began (guarded)
	childStarted int64 // runguard started ansible-playbook (guarded)
	childExited  int64 // ansible-playbook exited (guarded: runguard saw it)
	reaped       int64 // the direct child was reaped
	returned     int64 // Run returning (run dir removed)
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// startTook is how long the process took from exec to ansible-playbook
// running: runguard's own start and its exec of ansible-playbook when
// guarded, the exec alone otherwise.
func (e *execution) startTook() time.Duration {
	if e.t.childStarted > 0 {
		return time.Duration(max(e.t.childStarted-e.t.spawning, 0))
	}
	return time.Duration(max(e.t.spawned-e.t.spawning, 0))
}

// execution is one started process and what is learnt from it.
type execution struct {
	r    *Runner
	spec *Spec
	rd   *runDir
	log  zerolog.Logger
	t    timings

	cmd     *exec.Cmd
	pgid    int
	guarded bool
	ctrl    *os.File // our end of the control socket (guarded)
	outR    *os.File
	evR     *os.File
	started time.Time

	mu     sync.Mutex
	exited bool // the direct child exited: no more signals to its group
	exitCh chan struct{}
	state  *os.ProcessState
	reaped time.Time // when the direct child was seen to exit

	lastActivity atomic.Int64 // UnixNano of the last output or event
	tail         *tail
	events       eventState // owned by the event reader until evDone
	lastTask     atomic.Pointer[FailedTask]
	evDone       chan struct{}
	outDone      chan struct{}
	ctrlDone     chan struct{}
	queue        *eventQueue
	deliverDone  chan struct{}
	deliverPanic any
	panicCh      chan struct{}

	guardExit  time.Time // when ansible-playbook exited, from runguard's exit line
	startCh    chan int  // ansible-playbook's pid (guarded)
	startErr   atomic.Pointer[string]
	stopReason Outcome
	stopErr    error
	killTimer  *time.Timer
	cleaned    bool

	gate            *gate         // the play's first task waits for the takeover (gate.go)
	takeover        takeoverDone  // set by supervise once the takeover is done
	playbookStarted atomic.Int64  // UnixNano of the playbook_start event; 0 before
	gateBreach      chan struct{} // a task event arrived with the gate shut
}

// start starts the process (under the guard when there is one).
func (e *execution) start() error {
	r, spec, rd := e.r, e.spec, e.rd
	e.tail = newTail(r.cfg.OutputTailLines, r.cfg.OutputTailBytes, spec.Redact)
	e.exitCh = make(chan struct{})
	e.evDone = make(chan struct{})
	e.outDone = make(chan struct{})
	e.ctrlDone = make(chan struct{})
	e.deliverDone = make(chan struct{})
	e.panicCh = make(chan struct{}, 1)
	e.gateBreach = make(chan struct{}, 1)
	e.startCh = make(chan int, 1)
	e.queue = newEventQueue()

	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("output pipe: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("event pipe: %w", err)
	}
	closeAll := func(files ...*os.File) {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	argv := []string{r.cfg.PlaybookBin, "-i", rd.inventory, "-e", "@" + rd.vars,
		filepath.Join(r.cfg.AnsibleDir, "playbooks", spec.Playbook)}
	if spec.argv != nil { // a job (RunJob)
		argv = spec.argv
	}
	if r.sandbox != nil {
		wrapped, err := r.sandbox.wrap(rd, rd.binds, argv)
		if err != nil {
			closeAll(outR, outW, evR, evW)
			return err
		}
		argv = wrapped
	}
	var cmd *exec.Cmd
	var guardEnd *os.File
	if r.guard != "" {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			closeAll(outR, outW, evR, evW)
			return fmt.Errorf("control socket: %w", err)
		}
		e.ctrl = os.NewFile(uintptr(fds[0]), "runguard-control")
		guardEnd = os.NewFile(uintptr(fds[1]), "runguard-control")
		// umask 077: what Ansible writes in the run dir is private too.
		args := []string{"-control-fd=4", "-pass-fd=3", "-grace=" + r.cfg.KillGrace.String(), "-umask=077"}
		if c := rd.owner; c != nil {
			args = append(args, fmt.Sprintf("-uid=%d", c.UID), fmt.Sprintf("-gid=%d", c.GID))
		}
		args = append(append(args, "--"), argv...)
		cmd = exec.Command(r.guard, args...)
		cmd.ExtraFiles = []*os.File{evW, guardEnd} // fd 3, fd 4
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		e.guarded = true
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.ExtraFiles = []*os.File{evW} // fd 3
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if c := rd.owner; c != nil {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
		}
	}
	// The run's own private directory, never the source tree: whatever the
	// play leaves in its working directory (a core file, a retry file) goes
	// when the run dir does. ansible.cfg resolves its relative paths against
	// its own directory, not this one.
	cmd.Dir = rd.tmpDir
	cmd.Env = r.childEnv(rd, spec)
	cmd.Stdout = outW
	cmd.Stderr = outW
	e.lastActivity.Store(time.Now().UnixNano())
	e.t.spawning = monoNow()
	err = cmd.Start()
	e.t.spawned = monoNow()
	e.started = time.Now()
	closeAll(outW, evW, guardEnd)
	if err != nil {
		closeAll(outR, evR, e.ctrl)
		e.ctrl = nil
		return fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	e.cmd, e.pgid, e.outR, e.evR = cmd, cmd.Process.Pid, outR, evR
	if r.hooks.onSpawn != nil {
		r.hooks.onSpawn(e.pgid, rd.path)
	}

	go e.wait()
	go e.readOutput()
	go e.readEvents()
	go e.deliver()
	if e.guarded {
		go e.readControl()
	} else {
		close(e.ctrlDone)
		e.startCh <- cmd.Process.Pid
	}
	return nil
}

// wait waits for the direct child to exit, SIGKILLs whatever is left in
// its process group while the unreaped child still holds the group id (so
// the id cannot have been reused), then reaps it.
func (e *execution) wait() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, e.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	e.reaped = time.Now()
	e.mu.Lock()
	_ = syscall.Kill(-e.pgid, syscall.SIGKILL)
	e.exited = true
	if e.killTimer != nil {
		e.killTimer.Stop()
	}
	e.mu.Unlock()
	_ = e.cmd.Wait()
	e.t.reaped = monoNow()
	e.state = e.cmd.ProcessState
	close(e.exitCh)
}

// signalGroup sends sig to the process group unless the child has exited.
func (e *execution) signalGroup(sig syscall.Signal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.exited {
		_ = syscall.Kill(-e.pgid, sig)
	}
}

func (e *execution) touch() { e.lastActivity.Store(time.Now().UnixNano()) }

func (e *execution) readOutput() {
	defer close(e.outDone)
	readLines(e.outR, maxOutputLine, e.touch, func(raw []byte, long bool) {
		line := e.tail.add(raw, long)
		if e.spec.OnOutput != nil {
			e.spec.OnOutput(line)
		}
	})
}

func (e *execution) readEvents() {
	defer close(e.evDone)
	defer e.queue.close()
	readLines(e.evR, maxEventLine, e.touch, func(line []byte, long bool) {
		if long {
			e.events.malformed++
			return
		}
		if len(strings.TrimSpace(string(line))) == 0 {
			return
		}
		ev, err := decodeEvent(line, e.spec.Redact)
		if err != nil {
			e.events.malformed++
			return
		}
		e.events.add(ev)
		switch ev.Type {
		case EventPlaybookStart:
			e.playbookStarted.CompareAndSwap(0, time.Now().UnixNano())
		case EventPlayStart, EventStats:
		default:
			if opened, _ := e.gate.isOpen(); !opened && e.gate != nil {
				select {
				case e.gateBreach <- struct{}{}:
				default:
				}
			}
		}
		if ev.Type == EventTaskStart || ev.Type == EventHandlerStart {
			e.lastTask.Store(&FailedTask{Name: ev.Task, Play: ev.Play}) // its host: classify
		}
		e.queue.push(ev)
	})
}

// deliver calls OnEvent for every event, in order. A panic in OnEvent
// stops the run; Run re-raises it after cleaning up.
func (e *execution) deliver() {
	defer close(e.deliverDone)
	for {
		ev, ok := e.queue.pop()
		if !ok {
			return
		}
		if e.spec.OnEvent == nil || e.deliverPanic != nil {
			continue
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					e.deliverPanic = p
					e.panicCh <- struct{}{}
				}
			}()
			e.spec.OnEvent(ev)
		}()
	}
}

// readControl reads runguard's status lines until it exits.
func (e *execution) readControl() {
	defer close(e.ctrlDone)
	sc := bufio.NewScanner(e.ctrl)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		num := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			n, _ := strconv.ParseInt(f[i], 10, 64)
			return n
		}
		switch f[0] {
		case "start":
			e.t.guardMain, e.t.childStarted = num(2), num(3)
			e.startCh <- int(num(1))
		case "exit":
			e.t.childExited = num(1)
			e.guardExit = time.Now()
			if at := e.t.childExited; at > 0 {
				// Back-date to the exit runguard saw (same monotonic clock).
				e.guardExit = e.guardExit.Add(-time.Duration(max(monoNow()-at, 0)))
			}
		case "error":
			msg := e.spec.Redact(strings.TrimPrefix(sc.Text(), "error "))
			e.startErr.Store(&msg)
		}
	}
}

// stop ends the run for reason: SIGTERM to the group now, SIGKILL after
// KillGrace. Only the first reason counts.
func (e *execution) stop(reason Outcome, err error) {
	if e.stopReason != "" {
		return
	}
	e.stopReason, e.stopErr = reason, err
	e.log.Warn().Str("reason", string(reason)).Msg("stopping ansible-playbook")
	e.signalGroup(syscall.SIGTERM)
	e.mu.Lock()
	if !e.exited {
		e.killTimer = time.AfterFunc(e.r.cfg.KillGrace, func() { e.signalGroup(syscall.SIGKILL) })
	}
	e.mu.Unlock()
}

// supervise enforces the limits until the process exits, then collects the
// result.
func (e *execution) supervise(ctx context.Context, tk <-chan takeoverDone) (*Result, error) {
	spec := e.spec
	wall := time.NewTimer(spec.Timeout)
	defer wall.Stop()
	check := spec.IdleTimeout / 10
	check = min(max(check, 50*time.Millisecond), time.Second)
	idle := time.NewTicker(check)
	defer idle.Stop()
	done := ctx.Done()
	pid := 0
	for running := true; running; {
		select {
		case <-done:
			done = nil
			e.stop(OutcomeCancelled, fmt.Errorf("cancelled: %w", context.Cause(ctx)))
		case <-wall.C:
			e.stop(OutcomeTimeout, fmt.Errorf("run exceeded its time limit of %s", spec.Timeout))
		case <-idle.C:
			if quiet := time.Since(time.Unix(0, e.lastActivity.Load())); quiet > spec.IdleTimeout {
				idle.Stop()
				e.stop(OutcomeIdleTimeout, fmt.Errorf("no output for %s (limit %s)", quiet.Round(time.Second), spec.IdleTimeout))
			}
		case pid = <-e.startCh:
			e.log.Info().Int("pid", pid).Bool("guarded", e.guarded).Msg("ansible-playbook started")
			if spec.OnStart != nil {
				spec.OnStart(pid)
			}
		case <-e.panicCh:
			e.stop(OutcomeError, errors.New("OnEvent panicked"))
		case t := <-tk:
			tk = nil
			e.takeover = t
			e.t.takeover = int64(t.took)
			if t.stop != nil {
				e.stop(t.stop.Outcome, t.stop.Err)
				e.gate.close()
			} else {
				e.gate.open()
			}
		case <-e.gateBreach:
			e.stop(OutcomeError, errors.New("a task started before the takeover of the target was done "+
				"(the autoprov_events callback plugin did not wait at the gate)"))
		case <-e.exitCh:
			running = false
		}
	}
	e.gate.close()
	if tk != nil {
		// ansible-playbook ended first: the takeover still uses the run's
		// directory and agent.
		e.takeover = <-tk
	}
	e.cleanup()

	if pid == 0 {
		// The start line may have been read just before the exit was seen.
		select {
		case pid = <-e.startCh:
			if spec.OnStart != nil {
				spec.OnStart(pid)
			}
		default:
		}
	}
	if pid == 0 {
		// runguard could not start ansible-playbook.
		why := "runguard exited before starting it"
		if msg := e.startErr.Load(); msg != nil {
			why = *msg
		}
		return nil, fmt.Errorf("start ansible-playbook: %s", why)
	}
	return e.result(), nil
}

// gateWait is how long the play waited at the gate for the takeover: from
// the playbook_start event to the gate's opening (0 when it did not wait).
func (e *execution) gateWait() time.Duration {
	opened, at := e.gate.isOpen()
	started := e.playbookStarted.Load()
	if !opened || started == 0 {
		return 0
	}
	return max(at.Sub(time.Unix(0, started)), 0)
}

// playTook is how long ansible-playbook ran (Steps.Play); valid once it
// exited.
func (e *execution) playTook() time.Duration {
	exited := e.exitedAt()
	if exited.IsZero() || e.started.IsZero() {
		return 0
	}
	// e.started is when exec returned: the child ran from there on, less
	// runguard's own start when guarded.
	began := e.started.Add(e.startTook() - time.Duration(e.t.spawned-e.t.spawning))
	d := exited.Sub(began)
	if e.gate != nil {
		d -= e.gateWait()
	}
	return max(d, 0)
}

// exitedAt is when ansible-playbook exited (see Result.ExitedAt); valid
// once the child was reaped and the control socket drained.
func (e *execution) exitedAt() time.Time {
	if !e.guardExit.IsZero() {
		return e.guardExit
	}
	return e.reaped
}

// cleanup makes sure nothing of the run is left: it stops a still running
// group (panic path), waits until the direct child is reaped, kills ssh
// ControlPersist masters that left the group, and drains the pipes. It is
// idempotent.
func (e *execution) cleanup() {
	if e.cleaned || e.cmd == nil {
		return
	}
	e.cleaned = true
	select {
	case <-e.exitCh:
	default:
		// Only on a panic: no grace, the run is over.
		e.signalGroup(syscall.SIGKILL)
		<-e.exitCh
	}
	// Masters that left the group by setsid: runguard has killed them when
	// it exited normally (they then remove their sockets); otherwise find
	// them by the control path in their command line.
	if ents, err := os.ReadDir(e.rd.controlDir); err == nil && len(ents) > 0 {
		killReferring(e.rd.path)
	}
	if e.ctrl != nil {
		e.ctrl.Close() // runguard is gone; nothing reads this end any more
	}
	// The readers get EOF once every holder of the pipes is gone; if
	// something unexpected keeps one open, stop waiting after a while.
	timeout := time.NewTimer(5 * time.Second)
	defer timeout.Stop()
	for _, ch := range []chan struct{}{e.outDone, e.evDone, e.ctrlDone} {
		select {
		case <-ch:
		case <-timeout.C:
			e.log.Warn().Msg("output pipes still open after the process group exited; closing them")
			e.outR.Close()
			e.evR.Close()
			<-ch
		}
	}
	e.outR.Close()
	e.evR.Close()
	<-e.deliverDone
}
