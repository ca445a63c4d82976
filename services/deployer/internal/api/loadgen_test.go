package api_test

import (
	"bufio"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The load generators and meters of the benchmarks.

// loadResult is what one load phase measured.
type loadResult struct {
	done    int             // requests that succeeded
	failed  int64           // requests that failed
	took    time.Duration   // wall time of the phase
	lat     []time.Duration // sorted latencies of the successful requests
	cpu     cpuUse          // CPU used during the phase
	offered float64         // requests/s offered (open loop), 0 for a closed loop
}

func (r *loadResult) rate() float64 { return float64(r.done) / r.took.Seconds() }

// pct returns the p-quantile of the latencies in milliseconds.
func (r *loadResult) pct(p float64) float64 {
	if len(r.lat) == 0 {
		return 0
	}
	return float64(r.lat[int(p*float64(len(r.lat)-1))].Microseconds()) / 1000
}

// perRequest returns the CPU time used per successful request in
// microseconds: by this process (the service and the load generator), by
// the Postgres backends of the test's database, and by the whole Redis
// server (shared with whatever else uses it at the time).
func (r *loadResult) perRequest() (self, pg, rds float64) {
	if r.done == 0 {
		return 0, 0, 0
	}
	n := float64(r.done)
	return float64(r.cpu.self.Microseconds()) / n, float64(r.cpu.pg.Microseconds()) / n, float64(r.cpu.redis.Microseconds()) / n
}

// closedLoop runs workers that each send one request after the other for
// d. With a closed loop, latency and throughput are tied by the number of
// workers (Little's law: mean latency = workers / throughput).
func closedLoop(workers int, d time.Duration, m *cpuMeter, send func() (time.Duration, error)) *loadResult {
	lat := make([][]time.Duration, workers)
	var failed atomic.Int64
	before := m.read()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				took, err := send()
				if err != nil {
					failed.Add(1)
					continue
				}
				lat[w] = append(lat[w], took)
			}
		})
	}
	wg.Wait()
	r := &loadResult{took: time.Since(start), failed: failed.Load(), cpu: m.read().sub(before)}
	r.lat = slices.Concat(lat...)
	slices.Sort(r.lat)
	r.done = len(r.lat)
	return r
}

// openLoop offers rate requests per second for d, on a fixed schedule
// whatever the answers (as wrk2 and vegeta do), with up to conns requests
// in flight. A request's latency runs from the moment the schedule meant
// to send it, so a stalled server is charged for the requests it delayed
// (no coordinated omission).
func openLoop(rate float64, conns int, d time.Duration, m *cpuMeter, send func() (time.Duration, error)) *loadResult {
	interval := time.Duration(float64(time.Second) / rate)
	total := int(d / interval)
	due := make(chan time.Time, total)
	lat := make([][]time.Duration, conns)
	var failed atomic.Int64
	before := m.read()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() {
			for at := range due {
				if _, err := send(); err != nil {
					failed.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(at))
			}
		})
	}
	for i := range total {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		due <- at
	}
	close(due)
	wg.Wait()
	r := &loadResult{took: time.Since(start), failed: failed.Load(), cpu: m.read().sub(before), offered: rate}
	r.lat = slices.Concat(lat...)
	slices.Sort(r.lat)
	r.done = len(r.lat)
	return r
}

// cpuUse is CPU time used.
type cpuUse struct {
	self, pg, redis time.Duration
}

func (a cpuUse) sub(b cpuUse) cpuUse {
	return cpuUse{self: a.self - b.self, pg: a.pg - b.pg, redis: a.redis - b.redis}
}

// cpuMeter reads the CPU time used so far by this process, by the
// Postgres backends serving db's database (from /proc: the benchmark runs
// on the database's machine, over loopback) and by the Redis server (its
// INFO). A figure it cannot read stays zero.
type cpuMeter struct {
	db  *pgxpool.Pool
	rdb *redis.Client
	// pg remembers each backend's last reading, so that a backend that
	// exits between two readings keeps what it used.
	mu sync.Mutex
	pg map[int]time.Duration
}

func newCPUMeter(db *pgxpool.Pool, rdb *redis.Client) *cpuMeter {
	return &cpuMeter{db: db, rdb: rdb, pg: map[int]time.Duration{}}
}

func (m *cpuMeter) read() cpuUse {
	var u cpuUse
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if m.db != nil {
		rows, err := m.db.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
		if err == nil {
			var pids []int
			for rows.Next() {
				var pid int
				if rows.Scan(&pid) == nil {
					pids = append(pids, pid)
				}
			}
			rows.Close()
			m.mu.Lock()
			for _, pid := range pids {
				if t, ok := procCPU(pid); ok {
					m.pg[pid] = t
				}
			}
			for _, t := range m.pg {
				u.pg += t
			}
			m.mu.Unlock()
		}
	}
	if m.rdb != nil {
		if info, err := m.rdb.Info(ctx, "cpu").Result(); err == nil {
			sc := bufio.NewScanner(strings.NewReader(info))
			for sc.Scan() {
				k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
				if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
					if s, err := strconv.ParseFloat(v, 64); err == nil {
						u.redis += time.Duration(s * float64(time.Second))
					}
				}
			}
		}
	}
	return u
}

// clockTick is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTick = 10 * time.Millisecond

// procCPU returns the user and system time of process pid.
func procCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after its closing parenthesis (state is field 3, utime 14, stime 15).
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * clockTick, true
}

// report adds a phase's figures to b's output, each metric named with
// prefix.
func report(b *testing.B, prefix string, r *loadResult) {
	b.ReportMetric(r.rate(), prefix+"req/s")
	b.ReportMetric(r.pct(0.50), prefix+"p50_ms")
	b.ReportMetric(r.pct(0.99), prefix+"p99_ms")
	self, pg, rds := r.perRequest()
	b.ReportMetric(self, prefix+"cpu_go_us/req")
	b.ReportMetric(pg, prefix+"cpu_pg_us/req")
	b.ReportMetric(rds, prefix+"cpu_redis_us/req")
}
