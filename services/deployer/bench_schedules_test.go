package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// BenchmarkScheduleLaunch measures issue 36's figure: BENCH_SCHEDULES
// (default 10,000) schedules due at the same second, materialized by the
// real scheduler binary (its schedules loop, SCHEDULES_INTERVAL at its
// default of 1s) and launched by the deployer's Launcher (in this process,
// so that -cpuprofile sees it, with its default settings): each occurrence
// a job checked, stored with its Idempotency-Key and published on the job
// queue, as POST /api/v1/templates/{id}/launch does one. Each round moves every schedule's next
// occurrence to a whole second a little ahead and waits for all of them
// to be launched; it reports the seconds from that due time to the last
// occurrence written (due-to-materialized-s) and to the last job stored
// (due-to-last-job-s; the goal is at most 5), the launches per second from
// the first occurrence written to the last job, and fails on any
// occurrence launched twice or missing (duplicates, missing: 0).
func BenchmarkScheduleLaunch(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("BENCH_SCHEDULES")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	dsn := testenv.Postgres(b)
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	e := dt.Start(b, dt.Options{DB: pool, NoInfra: true})
	w := newScheduleWorld(b, dsn, strings.TrimPrefix(e.URL, "http://"))
	db := w.db
	w.addSchedules(b, "bench", "@every 1h", n, time.Now().Add(24*time.Hour))
	w.startScheduler(b)
	count := func(q string, args ...any) int {
		b.Helper()
		var c int
		if err := db.QueryRow(ctx, q, args...).Scan(&c); err != nil {
			b.Fatal(err)
		}
		return c
	}
	var toLast, toWritten, rate float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		due := time.Now().Truncate(time.Second).Add(2 * time.Second)
		if _, err := db.Exec(ctx, `UPDATE job_schedules SET next_at = $1`, due); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		launched := func() int {
			return count(`SELECT count(*) FROM schedule_occurrences WHERE occurrence = $1 AND launched_at IS NOT NULL`, due)
		}
		deadline := due.Add(2 * time.Minute)
		for last := time.Now(); launched() < n; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d occurrences written, %d launched 2 min after they were due", count(
					`SELECT count(*) FROM schedule_occurrences WHERE occurrence = $1`, due), n, launched())
			}
			if time.Since(last) > 5*time.Second {
				b.Logf("%v after due: %d launched", time.Since(due).Round(time.Second), launched())
				last = time.Now()
			}
		}
		b.StopTimer()
		var first, written, lastJob time.Time
		var jobs, distinct, failed int
		if err := db.QueryRow(ctx, `SELECT min(o.created_at), max(o.created_at), max(d.created_at), count(d.id),
				count(DISTINCT o.job_id), count(*) FILTER (WHERE o.error IS NOT NULL)
			FROM schedule_occurrences o LEFT JOIN deployments d ON d.id = o.job_id WHERE o.occurrence = $1`, due).
			Scan(&first, &written, &lastJob, &jobs, &distinct, &failed); err != nil {
			b.Fatal(err)
		}
		if failed > 0 || jobs != n || distinct != n {
			b.Fatalf("%d occurrences: %d jobs, %d distinct, %d refused", n, jobs, distinct, failed)
		}
		// Every job of the benchmark is of an occurrence, and on the queue
		// once.
		total := n * (i + 1)
		if c := count(`SELECT count(*) FROM deployments WHERE kind = 'job'`); c != total {
			b.Fatalf("%d jobs stored after %d occurrences (duplicates: %d)", c, total, c-total)
		}
		if q, err := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); err != nil || q != int64(total) {
			b.Fatalf("%d jobs on the queue after %d occurrences (%v)", q, total, err)
		}
		toLast += lastJob.Sub(due).Seconds()
		toWritten += written.Sub(due).Seconds()
		rate += float64(n) / lastJob.Sub(first).Seconds()
		b.Logf("round %d: due %s, written +%.2fs, first written +%.2fs, last job +%.2fs", i,
			due.Format(time.TimeOnly), written.Sub(due).Seconds(), first.Sub(due).Seconds(), lastJob.Sub(due).Seconds())
	}
	b.ReportMetric(toLast/float64(b.N), "due-to-last-job-s")
	b.ReportMetric(toWritten/float64(b.N), "due-to-materialized-s")
	b.ReportMetric(rate/float64(b.N), "launches/s")
	b.ReportMetric(0, "duplicates")
	b.ReportMetric(0, "ns/op")
}
