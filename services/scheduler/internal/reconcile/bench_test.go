package reconcile_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/app"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/reconcile"
)

// benchSource lists n servers, made as they are listed (as a provider's
// pages would arrive): what it keeps is a generation number per server,
// which change bumps for a share of them. It tells what changed
// (detect.ChangeDetector), its generation being a server's version;
// plainSource hides that, as a source that cannot tell.
type benchSource struct {
	gens []uint16
}

func (s *benchSource) Name() string { return "bench" }

func (s *benchSource) server(i int) fleet.Detected {
	return fleet.Detected{Handle: fmt.Sprintf("b-%06d", i), Address: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255),
		Labels: map[string]string{"group:web": "", "env": "prod", "gen": strconv.Itoa(int(s.gens[i]))}}
}

func (s *benchSource) Detect(_ context.Context, yield func(fleet.Detected) error) error {
	for i := range s.gens {
		if err := yield(s.server(i)); err != nil {
			return err
		}
	}
	return nil
}

func (s *benchSource) DetectChanges(_ context.Context, known func(string, uint64) bool, yield func(fleet.Detected, uint64) error) error {
	for i, g := range s.gens {
		if known(fmt.Sprintf("b-%06d", i), uint64(g)+1) {
			continue
		}
		if err := yield(s.server(i), uint64(g)+1); err != nil {
			return err
		}
	}
	return nil
}

// plainSource is a source that lists every server in full every tick.
type plainSource struct{ detect.Detector }

func newBenchSource(n int) *benchSource { return &benchSource{gens: make([]uint16, n)} }

// change gives every step-th server, from offset, the label value gen (1%
// for step 100).
func (s *benchSource) change(gen, step, offset int) {
	for i := offset % step; i < len(s.gens); i += step {
		s.gens[i] = uint16(gen)
	}
}

// rssMB returns the process's resident set size and its peak, in MB.
func rssMB() (cur, peak float64) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return cur, peak
}

func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// BenchmarkTick: one reconcile tick over a fleet in mixed states, with 1%
// of it changing at its source and 1% due for a job, at each size of
// BENCH_TICK_SIZES (default 100000,1000000), under the scheduler binary's
// default memory limit. It reports the tick's time (all of it Postgres
// round trips and the merge) by phase, the process's peak RSS during the
// ticks and the first listing's time, and prints the sizes side by side.
func BenchmarkTick(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if v := os.Getenv("BENCH_TICK_SIZES"); v != "" {
		sizes = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 100 {
				b.Fatalf("BENCH_TICK_SIZES: %q is not a fleet size (at least 100)", f)
			}
			sizes = append(sizes, n)
		}
	}
	// A size measured in under a second is run again with a larger b.N:
	// its row is its last run.
	rows := make([][2]tickFigures, len(sizes))
	for i, n := range sizes {
		b.Run(fmt.Sprintf("servers=%d", n), func(b *testing.B) {
			rows[i] = benchTick(b, n)
		})
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nreconcile tick, 1%% changing and 1%% due, GOMEMLIMIT %d MiB (median of 5 ticks);\n"+
		"\"tells\": the source tells what changed (detect.ChangeDetector), \"lists\": it lists every server in full\n%-28s",
		app.DefaultMemoryLimit>>20, "servers")
	for _, r := range rows {
		fmt.Fprintf(&out, "%9d tells%9d lists", r[0].servers, r[1].servers)
	}
	for _, line := range []struct {
		label  string
		val    func(tickFigures) float64
		format string
	}{
		{"ms a tick", func(r tickFigures) float64 { return r.tick }, "%15.0f"},
		{"  of which in Postgres", func(r tickFigures) float64 { return r.db }, "%15.0f"},
		{"  sync phase", func(r tickFigures) float64 { return r.sync }, "%15.0f"},
		{"  due phase", func(r tickFigures) float64 { return r.due }, "%15.1f"},
		{"  queue+stuck phases", func(r tickFigures) float64 { return r.queue }, "%15.0f"},
		{"MB peak RSS during ticks", func(r tickFigures) float64 { return r.peakMB }, "%15.0f"},
		{"first listing, s", func(r tickFigures) float64 { return r.firstListing.Seconds() }, "%15.1f"},
		{"  of which in Postgres", func(r tickFigures) float64 { return r.firstDB.Seconds() }, "%15.1f"},
	} {
		fmt.Fprintf(&out, "\n%-28s", line.label)
		for _, r := range rows {
			fmt.Fprintf(&out, line.format+line.format, line.val(r[0]), line.val(r[1]))
		}
	}
	fmt.Fprintf(os.Stderr, "%s\n(goals of issue 35 at 1M: < 2,000 ms a tick, < 300 MB, first listing < 20 s; at 100k: < 150 ms)\n", out.String())
}

// tickFigures are one size's medians.
type tickFigures struct {
	servers                    int
	tick, db, sync, due, queue float64 // ms
	peakMB                     float64
	firstListing, firstDB      time.Duration
}

// benchTick measures ticks over a fleet of n servers, first with a source
// that tells what changed, then with one that lists every server in full.
func benchTick(b *testing.B, n int) [2]tickFigures {
	ctx := context.Background()
	// As the scheduler binary does unless GOMEMLIMIT is set.
	debug.SetMemoryLimit(app.DefaultMemoryLimit)
	defer debug.SetMemoryLimit(math.MaxInt64)
	timer := &dbTimer{}
	db := tracedPool(b, timer)
	f := fleet.New(db, fleet.Options{})
	src := newBenchSource(n)
	mgr, err := detect.NewManager(f, []detect.Detector{src}, detect.Options{})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	timer.reset()
	if _, err := mgr.Sync(ctx); err != nil { // the first listing creates the fleet
		b.Fatal(err)
	}
	firstSync, firstDB := time.Since(start), timer.total()
	fmt.Fprintf(os.Stderr, "first listing of %d servers: %v, of which %v in Postgres\n", n, firstSync.Round(time.Millisecond), firstDB.Round(time.Millisecond))
	// Mixed states: 90% READY, 3% FAILED (a third of them due), 2%
	// UNREACHABLE in their cool-down, 3% PROVISIONING, 1% paused, 1% NEW.
	if _, err := db.Exec(ctx, `
		UPDATE servers SET status = CASE
				WHEN n < 90 THEN 'READY'
				WHEN n < 93 THEN 'FAILED'
				WHEN n < 95 THEN 'UNREACHABLE'
				WHEN n < 98 THEN 'PROVISIONING'
				WHEN n < 99 THEN 'READY'
				ELSE 'NEW' END,
			next_attempt_at = CASE WHEN n BETWEEN 90 AND 94 AND n <> 90 THEN now() + interval '1 hour' END,
			pending_job_id = CASE WHEN n BETWEEN 95 AND 97 THEN 'job-' || handle END,
			queued_at = CASE WHEN n BETWEEN 95 AND 97 THEN now() END,
			paused = (n = 98)
		FROM (SELECT handle AS h, (substr(handle, 3)::int % 100) AS n FROM servers) x
		WHERE servers.handle = x.h`); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(ctx, `VACUUM ANALYZE servers`); err != nil {
		b.Fatal(err)
	}
	const ticks = 5
	figs := [2]tickFigures{}
	for mode := range figs {
		if mode == 1 {
			// A manager of its own, as after a restart (the first one's
			// snapshot let go): its first listing (untimed) reads the
			// fleet and changes nothing.
			mgr = nil
			runtime.GC()
			if mgr, err = detect.NewManager(f, []detect.Detector{plainSource{src}}, detect.Options{}); err != nil {
				b.Fatal(err)
			}
			if _, err := mgr.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
		loop := reconcile.New(f, mgr, nil, nil, reconcile.Config{Batch: n / 100, Logger: zerolog.Nop()})
		figs[mode] = measureTicks(b, db, timer, loop, src, mode*ticks, ticks)
		figs[mode].servers, figs[mode].firstListing, figs[mode].firstDB = n, firstSync, firstDB
	}
	return figs
}

// measureTicks runs ticks ticks of loop, the first being tick first of the
// fleet, and returns their medians.
func measureTicks(b *testing.B, db *pgxpool.Pool, timer *dbTimer, loop *reconcile.Loop, src *benchSource, first, ticks int) tickFigures {
	ctx := context.Background()
	mode := "tells"
	if first > 0 {
		mode = "lists"
	}
	// What the set-up left (the first listing's garbage) goes back to the
	// system first.
	debug.FreeOSMemory()
	_, peakBefore := rssMB()
	// Reset the peak RSS (VmHWM): what counts is the ticks, not the set-up.
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	var took, syncT, dueT, queueT, dbT []time.Duration
	queued := 0
	if path := os.Getenv("BENCH_TICK_CPU_PROFILE"); path != "" {
		// The ticks only, not the first listing.
		if f, err := os.Create(fmt.Sprintf("%s.%d.%s", path, len(src.gens), mode)); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	b.ResetTimer()
	for i := first; i < first+ticks; i++ {
		b.StopTimer()
		src.change(i+1, 100, i) // 1% of the fleet changes at its source
		// 1% becomes due: servers READY a moment ago turn NEW again.
		if _, err := db.Exec(ctx, `UPDATE servers SET status = 'NEW', pending_job_id = NULL
			WHERE (substr(handle, 3)::int % 100) < 90 AND (substr(handle, 3)::int / 100) % 90 = $1`, i); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		timer.reset()
		rep, err := loop.Tick(ctx)
		if err != nil {
			b.Fatal(err)
		}
		dbT = append(dbT, timer.total())
		took, syncT, dueT, queueT = append(took, rep.Took), append(syncT, rep.SyncTook), append(dueT, rep.DueTook), append(queueT, rep.QueueTook+rep.StuckTook)
		queued += rep.Queued
	}
	b.StopTimer()
	if path := os.Getenv("BENCH_TICK_HEAP_PROFILE"); path != "" {
		// What the tick keeps between ticks (the snapshot, the claims).
		runtime.GC()
		if f, err := os.Create(fmt.Sprintf("%s.%d.%s", path, len(src.gens), mode)); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
		runtime.KeepAlive(loop)
	}
	cur, peak := rssMB()
	med := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	fig := tickFigures{tick: med(took), db: med(dbT), sync: med(syncT), due: med(dueT), queue: med(queueT), peakMB: peak}
	b.ReportMetric(fig.tick, "ms/tick-"+mode)
	b.ReportMetric(fig.db, "ms-db/tick-"+mode)
	b.ReportMetric(fig.sync, "ms/sync-"+mode)
	b.ReportMetric(fig.peakMB, "MB-peak-RSS-"+mode)
	b.ReportMetric(float64(queued)/float64(ticks), "queued/tick-"+mode)
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stderr, "tick over %d servers (1%% changing, 1%% due; the source %s): median %.0f ms, of which %.0f ms in Postgres "+
		"(phases: sync %.0f, due %.1f, queue+stuck %.0f); RSS %.0f MB, peak during the ticks %.0f MB "+
		"(%.0f MB before); load %s\n",
		len(src.gens), mode, fig.tick, fig.db, fig.sync, fig.due, fig.queue, cur, peak, peakBefore, loadavg())
	return fig
}

// dbTimer sums the time queries spend in Postgres (sent to answered).
type dbTimer struct {
	mu  sync.Mutex
	sum time.Duration
}

type startKey struct{}

func (d *dbTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, startKey{}, time.Now())
}

func (d *dbTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if t, ok := ctx.Value(startKey{}).(time.Time); ok {
		d.mu.Lock()
		d.sum += time.Since(t)
		d.mu.Unlock()
	}
}

func (d *dbTimer) reset() { d.mu.Lock(); d.sum = 0; d.mu.Unlock() }
func (d *dbTimer) total() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sum
}

// tracedPool opens a pool on a fresh database that reports query times to t.
func tracedPool(b *testing.B, t *dbTimer) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = t
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkRelay10k: 10,000 queued servers published from the outbox to
// Redis (and moved to PROVISIONING).
func BenchmarkRelay10k(b *testing.B) {
	const n = 10_000
	ctx := context.Background()
	db := testenv.Pool(b)
	opt, err := redis.ParseURL(testenv.RedisDB(b))
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	f := fleet.New(db, fleet.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO servers (handle, address) SELECT 'q-' || lpad(i::text, 5, '0'), '10.0.0.1' FROM generate_series(1, $1) i`, n); err != nil {
		b.Fatal(err)
	}
	due, err := f.Due(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	jobs := make([]fleet.Job, len(due))
	for i, c := range due {
		data, _ := messages.Encode(&messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: reconcile.NewJobID(c.Handle)}, ServerHandle: c.Handle})
		jobs[i] = fleet.Job{Handle: c.Handle, Version: c.Version, Action: c.Action, JobID: "j-" + c.Handle, Payload: data}
	}
	if q, err := f.Queue(ctx, jobs, "bench"); err != nil || len(q) != n {
		b.Fatalf("queue: %d %v", len(q), err)
	}
	relay := reconcile.NewRelay(f, stream.NewProducer(rdb, stream.ProducerOptions{}), reconcile.RelayConfig{})
	b.ResetTimer()
	start := time.Now()
	published, err := relay.Drain(ctx)
	took := time.Since(start)
	b.StopTimer()
	if err != nil || published != n {
		b.Fatalf("relayed %d: %v", published, err)
	}
	if l, _ := rdb.XLen(ctx, messages.StreamProvisionerQueue).Result(); l != n {
		b.Fatalf("stream holds %d entries", l)
	}
	b.ReportMetric(float64(took.Milliseconds()), "ms/10k")
	b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stderr, "relay of %d queued servers from the outbox to Redis: %v (%.0f msgs/s); load %s\n",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), loadavg())
}
