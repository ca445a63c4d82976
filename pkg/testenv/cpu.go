package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/stat's counters (100 on every
// Linux architecture Go supports here).
const clockTicks = 100

// MachineCPU is the CPU time the whole machine has spent busy since boot
// (user, nice, system, irq, softirq and steal of every CPU, from
// /proc/stat). Benchmarks whose both sides run on this machine (the
// service, its targets, Redis, Postgres) compare the difference across a
// run: the CPU a side costs is what bounds it once the CPU is the limit.
func MachineCPU(tb testing.TB) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatalf("machine CPU: %v", err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		tb.Fatalf("machine CPU: unexpected /proc/stat line %q", line)
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatalf("machine CPU: %q: %v", line, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// ProcessCPU is the CPU time process pid has spent itself (user and
// system, its children's excluded), from /proc/<pid>/stat.
func ProcessCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Fatalf("process CPU: %v", err)
	}
	// The command name (field 2) may hold spaces: count from its ")".
	i := strings.LastIndexByte(string(raw), ')')
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		tb.Fatalf("process CPU: unexpected /proc/%d/stat %q", pid, raw)
	}
	var ticks int64
	for _, v := range f[11:13] { // utime, stime (fields 14 and 15)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatalf("process CPU: /proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
