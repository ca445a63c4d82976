// Package proc reads processes from /proc and ends them, waiting on each
// through a pidfd: for the runner (ssh masters that outlive a run) and for
// runguard (whatever a play left behind).
package proc

import (
	"bytes"
	"errors"
	"os"
	"strconv"
)

// Stat is the part of /proc/<pid>/stat this package reads.
type Stat struct {
	State byte // R, S, D, Z (zombie), X (dead), ...
	PPid  int
	Pgrp  int
}

// Live reports whether the process has not exited (is neither a zombie nor
// dead).
func (s Stat) Live() bool { return s.State != 'Z' && s.State != 'X' }

// ReadStat parses /proc/<pid>/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	// "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return Stat{}, errors.New("malformed stat")
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return Stat{}, errors.New("malformed stat")
	}
	return Stat{State: f[0][0], PPid: ppid, Pgrp: pgrp}, nil
}

// Each calls fn with the pid of every process in /proc.
func Each(fn func(pid int)) {
	d, err := os.Open("/proc")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(name); err == nil {
			fn(pid)
		}
	}
}

// GroupMembers lists the live processes in process group pgid.
func GroupMembers(pgid int) []int {
	var out []int
	Each(func(pid int) {
		st, err := ReadStat(pid)
		if err == nil && st.Pgrp == pgid && st.Live() {
			out = append(out, pid)
		}
	})
	return out
}
