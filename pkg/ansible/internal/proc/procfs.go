// Package proc reads processes from /proc and ends them, waiting on each
// through a pidfd: for the runner (ssh masters that outlive a run) and for
// runguard (whatever a play left behind).
package proc

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
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

// ReadStat parses /proc/<pid>/stat. It reads with one open, one read and
// one close into a buffer of its own: runguard reads every process's
// stat after each play, so this is on the path from a play's end to its
// result.
func ReadStat(pid int) (Stat, error) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Stat{}, err
	}
	var buf [512]byte // the fields up to pgrp come first; comm is at most 64 bytes
	n, err := readFull(fd, buf[:])
	syscall.Close(fd)
	if err != nil {
		return Stat{}, err
	}
	return parseStat(buf[:n])
}

// parseStat parses the start of a stat line: "pid (comm) state ppid pgrp
// ...", where comm may hold spaces and parentheses.
func parseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("malformed stat")
	}
	var f [3][]byte
	rest := b[i+1:]
	for k := range f {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		f[k], rest = rest[:end], rest[end:]
	}
	if len(f[0]) != 1 {
		return Stat{}, errors.New("malformed stat")
	}
	ppid, err1 := strconv.Atoi(string(f[1])) // no allocation: the string does not escape
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return Stat{}, errors.New("malformed stat")
	}
	return Stat{State: f[0][0], PPid: ppid, Pgrp: pgrp}, nil
}

// readFull reads until buf is full or the end of the file.
func readFull(fd int, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
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
