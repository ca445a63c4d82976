package ansible

import (
	"bytes"
	"errors"
	"os"
	"strconv"
)

// procStat is the part of /proc/<pid>/stat this package reads.
type procStat struct {
	state byte
	ppid  int
	pgrp  int
}

// readProcStat parses /proc/<pid>/stat.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, errors.New("malformed stat")
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return procStat{}, errors.New("malformed stat")
	}
	return procStat{state: f[0][0], ppid: ppid, pgrp: pgrp}, nil
}

// forEachProcess calls fn with the pid of every process in /proc.
func forEachProcess(fn func(pid int)) {
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

// groupMembers lists the live (not zombie) processes in process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	forEachProcess(func(pid int) {
		st, err := readProcStat(pid)
		if err == nil && st.pgrp == pgid && st.state != 'Z' && st.state != 'X' {
			out = append(out, pid)
		}
	})
	return out
}
