// Command runguard runs one program (ansible-playbook) for the infra service
// so that nothing of it outlives the service.
//
//	runguard [-control-fd 4] [-pass-fd 3] [-grace 1s] [-umask 077] [-uid N -gid N] -- /usr/bin/ansible-playbook ARGS...
//
// The infra service starts runguard as the leader of a new process group
// (Setpgid); runguard starts the program in that group with the same
// environment, stdin/stdout/stderr and the -pass-fd descriptor (the event
// pipe) as the same fd number, and exits with the program's status (128+N
// when signal N killed it).
//
// The -control-fd descriptor is one end of a unix socket pair whose other end
// the service holds. runguard writes status lines on it:
//
//	start <program pid> <runguard main, CLOCK_MONOTONIC ns> <program started, ns>
//	exit <program exited, ns> <wait status>
//	error <text>            (the program could not be started; exit status 127)
//
// and reads it only to learn that the service is gone: end of file (the
// service exited or was killed, even with SIGKILL) makes runguard SIGKILL the
// whole process group and every process that left it, and exit.
//
// runguard is a child subreaper, so processes that leave the group with
// setsid (ssh ControlPersist masters) are re-parented to it. After the
// program exits it sends SIGTERM to everything left (group members and
// re-parented orphans), SIGKILL after -grace, and reaps them before exiting.
// SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to the group reach the program;
// runguard itself catches and ignores them (caught signals are reset to their
// default in the program, unlike ignored ones). The program runs with a core
// file size limit of 0: a crash leaves no core file holding its secrets.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
)

func main() {
	os.Exit(run())
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func run() int {
	started := monoNow()
	controlFD := flag.Int("control-fd", -1, "unix socket to the service (status out, EOF = service gone); -1: none")
	passFD := flag.Int("pass-fd", -1, "descriptor handed to the program under the same number; -1: none")
	grace := flag.Duration("grace", time.Second, "SIGTERM -> SIGKILL grace for processes left after the program exited")
	umask := flag.String("umask", "", "octal umask for the program (default: unchanged)")
	uid := flag.Int("uid", -1, "user id the program runs as (with -gid; default: runguard's)")
	gid := flag.Int("gid", -1, "group id the program runs as (with -uid)")
	flag.Parse()
	argv := flag.Args()
	if len(argv) == 0 || !strings.HasPrefix(argv[0], "/") {
		fmt.Fprintln(os.Stderr, "runguard: usage: runguard [flags] -- /absolute/program [args...]")
		return 2
	}

	if *umask != "" {
		m, err := strconv.ParseUint(*umask, 8, 32)
		if err != nil || m > 0o777 {
			fmt.Fprintf(os.Stderr, "runguard: bad -umask %q\n", *umask)
			return 2
		}
		syscall.Umask(int(m))
	}
	// No core files: a crashing program (or module) would leave one holding
	// the secrets of its environment. The limit is inherited by the program.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		fmt.Fprintf(os.Stderr, "runguard: setrlimit RLIMIT_CORE: %v\n", err)
		return 127
	}
	self := os.Getpid()
	if syscall.Getpgrp() != self {
		if err := syscall.Setpgid(0, 0); err != nil {
			fmt.Fprintf(os.Stderr, "runguard: setpgid: %v\n", err)
			return 127
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "runguard: subreaper: %v\n", err)
		return 127
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		for range sigs { // the program gets them too; runguard outlives it
		}
	}()

	var control *os.File
	if *controlFD >= 0 {
		syscall.CloseOnExec(*controlFD)
		control = os.NewFile(uintptr(*controlFD), "control")
	}
	report := func(format string, args ...any) {
		if control != nil {
			_, _ = fmt.Fprintf(control, format+"\n", args...)
		}
	}

	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	var passed *os.File
	if *passFD >= 0 {
		var st syscall.Stat_t
		if err := syscall.Fstat(*passFD, &st); err == nil {
			passed = os.NewFile(uintptr(*passFD), "passed")
			for len(files) < *passFD {
				files = append(files, nil)
			}
			files = append(files, passed)
		}
	}
	attr := &os.ProcAttr{Env: os.Environ(), Files: files}
	if *uid >= 0 || *gid >= 0 {
		if *uid < 0 || *gid < 0 {
			fmt.Fprintln(os.Stderr, "runguard: -uid and -gid go together")
			return 2
		}
		// No supplementary groups: the program has the user's rights only.
		attr.Sys = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(*uid), Gid: uint32(*gid), Groups: []uint32{}}}
	}
	proc, err := os.StartProcess(argv[0], argv, attr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runguard: start %s: %v\n", argv[0], err)
		report("error start %s: %v", argv[0], err)
		return 127
	}
	childStarted := monoNow()
	if passed != nil {
		_ = passed.Close()
	}
	child := proc.Pid
	report("start %d %d %d", child, started, childStarted)

	if control != nil {
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := control.Read(buf); err != nil {
					// The service is gone: no play may go on without it.
					killAll(self, syscall.SIGKILL, 0)
					os.Exit(137)
				}
			}
		}()
	}

	status, ok := reapUntil(child)
	report("exit %d %d", monoNow(), uint32(status))
	killAll(self, syscall.SIGTERM, *grace)
	if !ok {
		return 127
	}
	switch {
	case status.Exited():
		return status.ExitStatus()
	case status.Signaled():
		return 128 + int(status.Signal())
	default:
		return 127
	}
}

// reapUntil reaps children (orphans re-parented to us included) until pid
// has exited and returns its status.
func reapUntil(pid int) (syscall.WaitStatus, bool) {
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, false
		}
		if got == pid {
			return ws, true
		}
	}
}

// killAll signals every process left in our group and every child of ours
// (re-parented orphans) with sig, switches to SIGKILL after grace, and
// returns when we have no children left (or 5 s after grace). Every process
// of our group descends from us, and orphans are re-parented to us (the
// subreaper), so having no children means nothing is left. A process that
// left the group (setsid) is seen once its parent is gone and it is ours;
// hence a new look each time one of them exits. Between looks it waits on
// the processes themselves (their pidfds), not on a clock.
func killAll(self int, sig syscall.Signal, grace time.Duration) {
	var k proc.Killer
	defer k.Close()
	start := time.Now()
	for reap() {
		elapsed := time.Since(start)
		if sig != syscall.SIGKILL && elapsed >= grace {
			sig = syscall.SIGKILL
		}
		for _, p := range leftovers(self) {
			k.Signal(p, sig)
		}
		until := grace - elapsed // the switch to SIGKILL
		if sig == syscall.SIGKILL {
			if until = grace + 5*time.Second - elapsed; until <= 0 {
				return
			}
		}
		if k.Held() == 0 {
			// Nothing to wait on: a child exited between reap and the
			// look (reap collects it now), or one we could not open.
			until = min(until, time.Millisecond)
		}
		k.Wait(until)
	}
}

// reap collects exited children without blocking; it reports whether any
// child is left.
func reap() bool {
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return false // ECHILD: no children at all
		}
		if got == 0 {
			return true
		}
	}
}

// leftovers lists live processes (not zombies) other than self that are in
// our process group or are our children.
func leftovers(self int) []int {
	var out []int
	proc.Each(func(pid int) {
		if pid == self {
			return
		}
		st, err := proc.ReadStat(pid)
		if err == nil && st.Live() && (st.Pgrp == self || st.PPid == self) {
			out = append(out, pid)
		}
	})
	return out
}
