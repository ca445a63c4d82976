package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// leads reports whether the scheduler whose admin address is admin leads
// (its autoprov_scheduler_leader gauge is 1); false when it does not
// answer.
func leads(admin string) bool {
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + admin + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if strings.TrimSpace(line) == "autoprov_scheduler_leader 1" {
			return true
		}
	}
	return false
}

// TestSchedulesExactlyOnceAcrossKills: schedules of @every 1s run for
// over 200 occurrences by two replicas of the real scheduler binary, whose
// leader is killed with SIGKILL again and again (the other takes over; a
// new replica is started in the killed one's place), and launched by the
// real deployer binary, itself killed once and restarted. Every occurrence from each schedule's first due
// time to its last has exactly one job: none missing (a leader change
// takes far less than schedule.Grace, so the skip policy drops none),
// none twice, each job stored once and published once.
func TestSchedulesExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	const schedules, kills = 12, 6
	ctx := context.Background()
	dsn, redisURL := testenv.Postgres(t), testenv.RedisDB(t)
	bin := filepath.Join(t.TempDir(), "deployer")
	if err := testenv.GoBuild(bin, ".", false); err != nil {
		t.Fatal(err)
	}
	// A claim of a killed deployer lapses after 2 s; a job it stored but
	// had not published yet is published by the republisher after 2 s.
	startDeployer := func() (*testenv.Process, string) {
		api, admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		p := testenv.StartBinary(t, bin, testenv.BinaryEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL, "API_ADDR="+api,
			"ADMIN_ADDR="+admin, "LOG_FORMAT=json", "WEBHOOK_SIGNING_KEY=schedules-webhook-signing-key-0123456789abcdef",
			"SCHEDULE_LAUNCH_LEASE=2s", "REPUBLISH_AFTER=2s"))
		p.WaitHTTP("http://"+admin+"/readyz", 200, 2*time.Minute)
		return p, api
	}
	deployer, api := startDeployer()
	w := newScheduleWorld(t, dsn, api)
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	ids := w.addSchedules(t, "every-second", "@every 1s", schedules, start)

	type replica struct {
		p     *testenv.Process
		admin string
	}
	// The leader is checked every tick: a replica takes over within one
	// after the leader's session ends.
	settings := []string{"TICK_INTERVAL=200ms", "SCHEDULES_INTERVAL=250ms"}
	var replicas []replica
	for range 2 {
		p, a := w.startScheduler(t, settings...)
		replicas = append(replicas, replica{p, a})
	}
	leader := func() int {
		t.Helper()
		var at int
		testenv.WaitFor(t, 30*time.Second, "one scheduler leading", func() bool {
			n := 0
			for i, r := range replicas {
				if leads(r.admin) {
					at, n = i, n+1
				}
			}
			return n == 1
		})
		return at
	}
	occurrences := func() int {
		t.Helper()
		var n int
		if err := w.db.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// inFlight counts the occurrences claimed and not recorded.
	inFlight := func() int {
		var n int
		_ = w.db.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE launched_at IS NULL AND claimed_until > now()`).Scan(&n)
		return n
	}
	changes, took, claimed := 0, time.Duration(0), 0
	for k := 0; k < kills || occurrences() < 200+schedules*2; k++ {
		if k > 4*kills {
			t.Fatalf("%d occurrences after %d kills", occurrences(), k)
		}
		time.Sleep(2500 * time.Millisecond)
		old := leader()
		replicas[old].p.Signal(syscall.SIGKILL)
		replicas[old].p.Wait(10 * time.Second)
		killed := time.Now()
		testenv.WaitFor(t, 10*time.Second, "the other scheduler leading", func() bool { return leads(replicas[1-old].admin) })
		took = max(took, time.Since(killed))
		changes++
		p, a := w.startScheduler(t, settings...)
		replicas[old] = replica{p, a}
		if k == kills/2 {
			// The deployer too, in the middle of a launch if it can be
			// caught there (a few tries): what it had claimed and not
			// recorded is launched by the next one once the claim lapses,
			// into the jobs already made.
			for try := 0; try < 5 && claimed == 0; try++ {
				for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && inFlight() == 0; {
				}
				deployer.Signal(syscall.SIGKILL)
				deployer.Wait(10 * time.Second)
				claimed = inFlight()
				deployer, _ = startDeployer()
			}
		}
	}
	// Done: no more occurrences; the launcher drains what was written.
	if _, err := w.db.Exec(ctx, `UPDATE job_schedules SET paused = true`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "every occurrence launched", func() bool {
		var pending int
		_ = w.db.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE launched_at IS NULL`).Scan(&pending)
		return pending == 0
	})
	total := occurrences()
	if total < 200 {
		t.Fatalf("%d occurrences, want at least 200", total)
	}
	for _, id := range ids {
		var n int
		var first, last time.Time
		if err := w.db.QueryRow(ctx, `SELECT count(*), min(occurrence), max(occurrence) FROM schedule_occurrences
			WHERE schedule_id = $1`, id).Scan(&n, &first, &last); err != nil {
			t.Fatal(err)
		}
		if want := int(last.Sub(first)/time.Second) + 1; n != want || !first.Equal(start) {
			t.Errorf("schedule %s: %d occurrences from %s to %s, want %d (one a second, from %s)", id, n,
				first.Format(time.TimeOnly), last.Format(time.TimeOnly), want, start.Format(time.TimeOnly))
		}
	}
	var jobs, distinct, refused, stored int
	if err := w.db.QueryRow(ctx, `SELECT count(job_id), count(DISTINCT job_id), count(error) FROM schedule_occurrences`).
		Scan(&jobs, &distinct, &refused); err != nil {
		t.Fatal(err)
	}
	if err := w.db.QueryRow(ctx, `SELECT count(*) FROM deployments WHERE kind = 'job'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var queued int64
	testenv.WaitFor(t, 30*time.Second, "every stored job published", func() bool {
		queued, err = rdb.XLen(ctx, messages.StreamAnsibleJobQueue).Result()
		return err == nil && queued >= int64(stored)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d schedules, %d occurrences, %d leader changes (each within %v of the kill), the deployer killed with %d claimed: "+
		"%d jobs (%d distinct), %d stored, %d queued, %d refused",
		schedules, total, changes, took.Round(time.Millisecond), claimed, jobs, distinct, stored, queued, refused)
	if jobs != total || distinct != total || stored != total || queued != int64(total) || refused != 0 {
		t.Errorf("%d occurrences: %d with a job, %d distinct jobs, %d stored, %d queued, %d refused; want one job each",
			total, jobs, distinct, stored, queued, refused)
	}
}
