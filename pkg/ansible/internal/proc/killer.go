package proc

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Killer signals processes and waits for them to exit. It holds each
// process by a pidfd from its first signal on, so that no later signal can
// reach another process that took over its pid, and Wait sleeps in poll(2)
// until one of them exits: no sleep-polling. A Killer is not safe for
// concurrent use; Close releases its pidfds.
type Killer struct {
	procs map[int]*held
	// byPID counts processes signalled by pid because pidfd_open failed
	// (a kernel before 5.3): Wait can only pause briefly for them, then
	// forgets them (the caller looks for what is left).
	byPID int
}

// held is a process held by its pidfd.
type held struct {
	fd  int
	sig syscall.Signal // last signal sent (0: none)
}

// fallbackPause is how long Wait pauses for processes it holds no pidfd of.
const fallbackPause = 5 * time.Millisecond

// Signal sends sig to pid unless sig was the last signal sent to it, and
// holds pid for Wait. A process that is gone already is skipped.
func (k *Killer) Signal(pid int, sig syscall.Signal) {
	if k.procs == nil {
		k.procs = map[int]*held{}
	}
	h := k.procs[pid]
	if h == nil {
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case errors.Is(err, unix.ESRCH):
			return
		case err != nil:
			_ = syscall.Kill(pid, sig)
			k.byPID++
			return
		}
		h = &held{fd: fd}
		k.procs[pid] = h
	}
	if h.sig == sig {
		return
	}
	h.sig = sig
	_ = unix.PidfdSendSignal(h.fd, sig, nil, 0) // fails only for an exited process
}

// Held reports how many signalled processes have not been seen to exit.
func (k *Killer) Held() int { return len(k.procs) }

// Wait returns once one of the held processes has exited (it is then no
// longer held), or after timeout. With nothing held it returns at once.
func (k *Killer) Wait(timeout time.Duration) {
	if len(k.procs) == 0 {
		if k.byPID > 0 {
			time.Sleep(min(max(timeout, 0), fallbackPause))
			k.byPID = 0
		}
		return
	}
	fds := make([]unix.PollFd, 0, len(k.procs))
	pids := make([]int, 0, len(k.procs))
	for pid, h := range k.procs {
		fds = append(fds, unix.PollFd{Fd: int32(h.fd), Events: unix.POLLIN})
		pids = append(pids, pid)
	}
	if k.byPID > 0 {
		timeout = min(timeout, fallbackPause)
	}
	ms := int((max(timeout, 0) + time.Millisecond - 1) / time.Millisecond)
	if k.byPID > 0 {
		k.byPID = 0
	}
	if _, err := unix.Poll(fds, ms); err != nil {
		return // EINTR: the caller looks again
	}
	for i, fd := range fds {
		if fd.Revents != 0 { // POLLIN: exited
			_ = unix.Close(int(fd.Fd))
			delete(k.procs, pids[i])
		}
	}
}

// WaitAll waits until every held process has exited or deadline passes,
// and reports whether they all did.
func (k *Killer) WaitAll(deadline time.Time) bool {
	for len(k.procs) > 0 || k.byPID > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		k.Wait(left)
	}
	return true
}

// Close releases the pidfds of the processes still held.
func (k *Killer) Close() {
	for pid, h := range k.procs {
		_ = unix.Close(h.fd)
		delete(k.procs, pid)
	}
}
