//go:build chaos

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The fault-injection suite (make chaos, make chaos-long): for each
// scenario, several real infra replicas take provisioning requests
// published from outside for several loopback sshd servers, from a real
// Redis and a real Postgres, while one kind of fault is injected at random
// points; then everything is left to settle and a checker counts what a
// user would call a failure. One table row per scenario is printed; any
// non-zero count fails the test.
//
// Sizes: the short form (CI) is small; the scenarios run side by side, as
// many at once as go test's -parallel flag allows. CHAOS=long uses the sizes of issue 10 (3 replicas, 5 s lease, 6 servers,
// 36 requests of a 20 s play). CHAOS_REPEAT=n repeats the whole table n
// times with different seeds (each printed); CHAOS_SEED=s runs seed s.
// CHAOS_SCENARIOS=a,b runs only the named scenarios.

// chaosSize is the shape of one run.
type chaosSize struct {
	replicas, servers, requests int
	play                        time.Duration // how long each play holds its server
	lease                       time.Duration
	redisDown                   time.Duration
	settle                      time.Duration // how long the settle phase may take at most
	short                       bool          // the CI form: the scenarios marked long are left out
}

var (
	chaosShort = chaosSize{replicas: 3, servers: 2, requests: 4, play: time.Second, lease: 2 * time.Second,
		redisDown: 5 * time.Second, settle: 8 * time.Minute, short: true}
	chaosLong = chaosSize{replicas: 3, servers: 6, requests: 36, play: 20 * time.Second, lease: 5 * time.Second,
		redisDown: 8 * time.Second, settle: 20 * time.Minute}
)

// chaosWorld is one scenario's system: its replicas, servers, and the
// Redis and Postgres it may fault.
type chaosWorld struct {
	*e2e
	t        *testing.T
	size     chaosSize
	rng      *rand.Rand
	hosts    []string
	mu       sync.Mutex // guards replicas, names, published, other
	replicas []*infraProc
	names    []string
	redis    *testenv.RedisServer
	sentinel *testenv.SentinelSet
	pg       *testenv.PostgresServer
	// published counts the publishes of each job id.
	published map[string]int
	jobs      []string
	other     []string // notes for the table's Other column (failures)
	info      []string // notes for the table's Other column (not failures)
}

// scenario is one row of the table: a fault and when to inject it.
type scenario struct {
	name  string
	fault string // the table's Fault column
	long  bool   // only in the long form (CHAOS=long)
	ownPG bool   // the scenario stops Postgres: it gets its own server
	// sentinel: Redis is a primary, a replica and three Sentinels.
	sentinel bool
	inject   func(w *chaosWorld)
}

func chaosScenarios() []scenario {
	return []scenario{
		{name: "none", fault: "none", long: true, inject: func(*chaosWorld) {}},
		{name: "kill9", fault: "kill -9 of one or two replicas, restarted", inject: (*chaosWorld).killReplicas},
		{name: "sigterm", fault: "SIGTERM of a replica, restarted", inject: (*chaosWorld).stopReplica},
		{name: "redis", fault: "Redis kill -9, back after %s (AOF everysec)", inject: (*chaosWorld).killRedis},
		{name: "pg2s", fault: "Postgres down 2 s", ownPG: true, inject: func(w *chaosWorld) { w.stopPostgres(2 * time.Second) }},
		{name: "pg30s", fault: "Postgres down 30 s", ownPG: true, inject: func(w *chaosWorld) { w.stopPostgres(30 * time.Second) }},
		{name: "dup", fault: "duplicate publishes of one job id", inject: (*chaosWorld).duplicates},
		{name: "sentinel", fault: "Redis primary failed over (Sentinel)", sentinel: true, inject: (*chaosWorld).failover},
	}
}

// chaosRow is one line of the printed table.
type chaosRow struct {
	fault                              string
	requests, withResult, lost         int
	conflicting, overlapping, leftover int
	other                              []string
}

func TestChaos(t *testing.T) {
	size := chaosShort
	if os.Getenv("CHAOS") == "long" {
		size = chaosLong
	}
	repeat := 1
	if s := os.Getenv("CHAOS_REPEAT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CHAOS_REPEAT=%q: want a positive number", s)
		}
		repeat = n
	}
	base := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		var err error
		if base, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
		repeat = 1
	}
	scenarios := chaosScenarios()
	if size.short {
		var keep []scenario
		for _, sc := range scenarios {
			if !sc.long {
				keep = append(keep, sc)
			}
		}
		scenarios = keep
	}
	if s := os.Getenv("CHAOS_SCENARIOS"); s != "" {
		scenarios = chaosScenarios()
		want := map[string]bool{}
		for _, n := range strings.Split(s, ",") {
			want[strings.TrimSpace(n)] = true
		}
		var keep []scenario
		for _, sc := range scenarios {
			if want[sc.name] {
				keep = append(keep, sc)
			}
		}
		if len(keep) == 0 {
			t.Fatalf("CHAOS_SCENARIOS=%q names no scenario", s)
		}
		scenarios = keep
	}
	binaries(t) // build once, before the clock of any scenario starts

	for r := range repeat {
		seed := base + uint64(r)*7919
		t.Logf("repeat %d/%d: CHAOS_SEED=%d", r+1, repeat, seed)
		rows := make([]chaosRow, len(scenarios))
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			for i, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel() // as many at once as go test's -parallel allows
					rows[i] = runScenario(t, sc, size, seed+uint64(i))
				})
			}
		})
		printTable(t, seed, size, rows)
		if !ok {
			t.Fatalf("repeat %d failed: re-run it with CHAOS_SEED=%d (CHAOS=%s)", r+1, seed, os.Getenv("CHAOS"))
		}
	}
}

// printTable prints the table for one repeat.
func printTable(t *testing.T, seed uint64, size chaosSize, rows []chaosRow) {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos table, CHAOS_SEED=%d: %d replicas, %s lease, %d servers, %d requests of a %s play\n",
		seed, size.replicas, size.lease, size.servers, size.requests, size.play)
	b.WriteString("| Fault | Requests | With a result | Lost | Conflicting results | Overlapping work on one server | Left behind | Other |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.fault == "" {
			continue // not run (its subtest stopped early)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d servers | %d | %s |\n", r.fault, r.requests, r.withResult,
			r.lost, r.conflicting, r.overlapping, r.leftover, strings.Join(r.other, "; "))
	}
	t.Log("\n" + b.String())
	// Also on stdout, so `make chaos` shows it without -v noise filters.
	fmt.Print(b.String())
}

// chaosPlay replaces the test playbooks' shared body: the run's start, its
// work and its end happen in one process on the target, so that work which
// outlives its controller (a killed play) still records when it ended, and
// the target's own record shows which run held the server when.
const chaosPlay = `---
- name: Fix this run's token once
  ansible.builtin.set_fact:
    run_id: "{{ lookup('ansible.builtin.pipe', 'cat /proc/sys/kernel/random/uuid') }}"

- name: Hold the server (start, work and end recorded by one process on the target)
  ansible.builtin.shell: >-
    echo "start {{ playbook_name }} {{ run_id }} $(date +%s.%N)" >> {{ out_log }};
    sleep {{ ctl.sleep | default(0) }};
    echo "end {{ playbook_name }} {{ run_id }} $(date +%s.%N)" >> {{ out_log }}
  changed_when: true
`

func runScenario(t *testing.T, sc scenario, size chaosSize, seed uint64) chaosRow {
	t.Logf("%s: seed %d", sc.name, seed)
	w := &chaosWorld{t: t, size: size, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), published: map[string]int{}}
	row := chaosRow{fault: sc.fault}
	if sc.name == "redis" {
		row.fault = fmt.Sprintf(sc.fault, size.redisDown)
	}

	var first *testenv.SSHD
	for i := range size.servers {
		sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
		if i == 0 {
			first = sshd
			w.e2e = newE2E(t, sshd)
		} else {
			// infra has one SSH key: every server authorizes the first's.
			f, err := os.OpenFile(filepath.Join(sshd.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = fmt.Fprintln(f, first.ClientPublicKey)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			w.setUp(sc)
		}
		h := fmt.Sprintf("web-%d", i+1)
		w.hosts = append(w.hosts, h)
		w.addServer(h, sshd)
		w.control(h, map[string]any{"sleep": size.play.Seconds()})
	}
	for range size.replicas {
		w.startReplica(-1)
	}

	for i := range size.requests {
		id := fmt.Sprintf("job-%d", i)
		w.jobs = append(w.jobs, id)
		w.publishJob(id, w.hosts[i%len(w.hosts)])
	}
	// Redis's AOF is flushed every second: give the requests that second,
	// so that a Redis kill tests infra, not the publisher.
	time.Sleep(2 * time.Second)
	start := time.Now()
	sc.inject(w)
	t.Logf("%s: fault done after %s", sc.name, time.Since(start).Round(time.Millisecond))

	w.settleAndCheck(&row)
	return row
}

// setUp gives the scenario its own Redis (with AOF, everysec, as an
// operator would run it) and, when it stops Postgres, its own Postgres.
func (w *chaosWorld) setUp(sc scenario) {
	t := w.t
	if sc.sentinel {
		w.sentinel = testenv.StartSentinelSet(t)
		w.redisURL = "redis://" + w.sentinel.Primary() + "/0" // with Sentinel only its db counts
		w.rdb = w.sentinel.Client()
		w.env = append(w.env, "REDIS_SENTINEL_MASTER="+w.sentinel.Master,
			"REDIS_SENTINEL_ADDRS="+strings.Join(w.sentinel.Addrs(), ","))
	} else {
		w.redis = testenv.StartRedisServer(t, "--appendfsync", "everysec")
		w.redisURL = w.redis.URL()
		w.rdb = w.redis.Client()
		if got, err := w.rdb.ConfigGet(context.Background(), "appendfsync").Result(); err != nil || got["appendfsync"] != "everysec" {
			t.Fatalf("redis appendfsync = %v (%v), want everysec", got, err)
		}
	}
	if sc.ownPG {
		w.pg = testenv.StartPostgresServer(t)
		w.dsn = w.pg.URL()
		pool, err := store.Open(context.Background(), w.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		w.pool = pool
	}
	// The replicas migrate the database; the servers are added after.
	if err := os.WriteFile(filepath.Join(w.ansibleDir, "playbooks", "_run.yml"), []byte(chaosPlay), 0o644); err != nil {
		t.Fatal(err)
	}
	w.env = append(w.env,
		"STREAM_LEASE="+w.size.lease.String(),
		"LOG_LEVEL=info",
		"DB_OUTAGE_WAIT=3m",
	)
	// The first replica migrates the database before servers are added.
	w.startReplica(-1)
}

// startReplica starts a replica into slot i (-1: a new slot). A restarted
// replica keeps its stable consumer name half of the time (as a
// StatefulSet would), so that both ways back to a pending entry are taken:
// its own re-read at start and another replica's claim after the lease.
func (w *chaosWorld) startReplica(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i < 0 {
		if len(w.replicas) >= w.size.replicas {
			return
		}
		w.replicas = append(w.replicas, nil)
		w.names = append(w.names, testenv.Unique("infra-"))
		i = len(w.replicas) - 1
	} else if w.rng.IntN(2) == 0 {
		w.names[i] = testenv.Unique("infra-")
	}
	w.replicas[i] = w.infra("STREAM_CONSUMER_NAME=" + w.names[i])
}

// publishJob publishes a provisioning request for host under id.
func (w *chaosWorld) publishJob(id, host string) {
	w.mu.Lock()
	w.published[id]++
	w.mu.Unlock()
	w.provision(id, host)
}

// pause sleeps a random time in [min, max).
func (w *chaosWorld) pause(lo, hi time.Duration) {
	time.Sleep(lo + time.Duration(w.rng.Int64N(int64(hi-lo))))
}

// window is the span in which faults are injected: while most requests
// are still in flight.
func (w *chaosWorld) window() time.Duration {
	perServer := (w.size.requests + w.size.servers - 1) / w.size.servers
	return time.Duration(perServer) * w.size.play * 2 / 3
}

func (w *chaosWorld) note(failure bool, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := fmt.Sprintf(format, args...)
	w.t.Log(s)
	if failure {
		w.other = append(w.other, s)
	} else {
		w.info = append(w.info, s)
	}
}

// killReplicas kills one or two replicas with -9 at random points and
// restarts them after a random pause, three times.
func (w *chaosWorld) killReplicas() {
	for round := range 3 {
		w.pause(300*time.Millisecond, w.window()/3)
		n := 1 + w.rng.IntN(2)
		victims := w.rng.Perm(len(w.replicas))[:n]
		for _, i := range victims {
			w.t.Logf("round %d: kill -9 of replica %d", round, i)
			w.replicas[i].Signal(syscall.SIGKILL)
			w.replicas[i].Wait(10 * time.Second)
		}
		w.pause(0, 3*time.Second)
		for _, i := range victims {
			w.startReplica(i)
		}
	}
}

// stopReplica stops a replica with SIGTERM at random points, twice; it must
// exit 0 within SHUTDOWN_GRACE, and is restarted.
func (w *chaosWorld) stopReplica() {
	for round := range 2 {
		w.pause(300*time.Millisecond, w.window()/2)
		i := w.rng.IntN(len(w.replicas))
		w.t.Logf("round %d: SIGTERM of replica %d", round, i)
		w.replicas[i].Signal(syscall.SIGTERM)
		if code := w.replicas[i].Wait(time.Minute); code != 0 {
			w.note(true, "replica exited %d after SIGTERM", code)
		}
		w.startReplica(i)
	}
}

// killRedis kills Redis with -9 at a random point and starts it again on
// the same AOF after the scenario's outage.
func (w *chaosWorld) killRedis() {
	w.pause(300*time.Millisecond, w.window())
	w.t.Logf("kill -9 of redis-server for %s", w.size.redisDown)
	w.redis.Kill()
	time.Sleep(w.size.redisDown)
	w.redis.Start()
}

// failover fails the Redis primary over to its replica at a random point
// (SENTINEL FAILOVER), once the requests reached the replica.
func (w *chaosWorld) failover() {
	if n, err := w.rdb.Do(context.Background(), "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		w.note(true, "WAIT for the replica: %d %v", n, err)
	}
	w.pause(300*time.Millisecond, w.window())
	old := w.sentinel.Primary()
	w.sentinel.Failover()
	w.t.Logf("Redis failed over from %s to %s", old, w.sentinel.Primary())
}

// stopPostgres stops Postgres (fast shutdown: every session ended) at a
// random point for down.
func (w *chaosWorld) stopPostgres(down time.Duration) {
	w.pause(300*time.Millisecond, w.window())
	w.t.Logf("Postgres stopped for %s", down)
	w.pg.Stop()
	time.Sleep(down)
	w.pg.Start()
}

// duplicates publishes some job ids again at random points: right away,
// while the first delivery runs, and after it finished.
func (w *chaosWorld) duplicates() {
	host := map[string]string{}
	for i, id := range w.jobs {
		host[id] = w.hosts[i%len(w.hosts)]
	}
	for round := range 4 {
		if round > 0 {
			w.pause(300*time.Millisecond, w.window()/2)
		}
		id := w.jobs[w.rng.IntN(len(w.jobs))]
		w.t.Logf("round %d: %s published again", round, id)
		w.publishJob(id, host[id])
	}
	// One more after its first run surely finished.
	id := w.jobs[0]
	for deadline := time.Now().Add(w.size.settle); len(w.provisionResults(id)) == 0; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			return // the checker counts it
		}
	}
	w.t.Logf("%s published again after its result", id)
	w.publishJob(id, host[id])
}

// settleAndCheck waits until every request has a result and every entry
// is acknowledged (or the settle time is up), then counts.
func (w *chaosWorld) settleAndCheck(row *chaosRow) {
	t := w.t
	ctx := context.Background()
	settleStart := time.Now()
	deadline := settleStart.Add(w.size.settle)
	for time.Now().Before(deadline) {
		if w.allAnswered() && w.pendingAndUnread() == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("settled after %s", time.Since(settleStart).Round(time.Millisecond))
	// Let whatever a killed run left on a target finish (a play outliving
	// its controller ends within one play), so that the target's record
	// shows it.
	time.Sleep(w.size.play + time.Second)

	row.requests = len(w.jobs)
	for _, id := range w.jobs {
		rs := w.provisionResults(id)
		if len(rs) == 0 {
			row.lost++
			t.Errorf("%s: no result", id)
			continue
		}
		row.withResult++
		distinct := 1
		for _, r := range rs[1:] {
			if r.Status != rs[0].Status || r.Attempt != rs[0].Attempt || r.StartedAt != rs[0].StartedAt || r.FinishedAt != rs[0].FinishedAt {
				distinct++
				t.Errorf("%s: two different results: %+v and %+v", id, rs[0].Outcome, r.Outcome)
			}
		}
		if distinct > 1 {
			row.conflicting++
		}
		// Results are published at least once (a result whose
		// acknowledgement was lost to a crash or a Redis restart is
		// published again from the stored run) and their readers keep the
		// first per job id: identical copies are not a failure, but the
		// table shows them.
		if distinct == 1 && len(rs) > 1 {
			w.note(false, "%s: %d identical results for %d publishes", id, len(rs), w.published[id])
		}
		if rs[0].Status != messages.StatusSucceeded {
			w.note(true, "%s: %s %+v", id, rs[0].Status, rs[0].Error)
		}
	}

	for _, h := range w.hosts {
		if n := overlapping(w.spans(h)); n > 0 {
			row.overlapping++
			t.Errorf("%s: %d pairs of runs overlapped on the server: %+v", h, n, w.spans(h))
		}
	}

	// Entries still pending or never read, in every group of the queue.
	switch n := w.pendingAndUnread(); {
	case n < 0:
		w.note(true, "the queue's groups could not be read")
	case n > 0:
		row.leftover += n
		t.Errorf("%d entries still pending or unread in the queue's groups", n)
	}
	if dead := w.results(messages.StreamProvisionerQueue + ":dead"); len(dead) > 0 {
		w.note(true, "%d dead letters", len(dead))
	}

	// Servers and runs left in a transient state.
	var servers, runs int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM servers WHERE status = $1`, store.ServerProvisioning).Scan(&servers); err != nil {
		t.Fatal(err)
	}
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM runs WHERE state = $1`, store.RunRunning).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if servers+runs > 0 {
		row.leftover += servers + runs
		t.Errorf("left in a transient state: %d servers %s, %d runs %s", servers, store.ServerProvisioning, runs, store.RunRunning)
	}

	// Processes and run directories left behind, while the replicas idle
	// and again once they stopped.
	row.leftover += w.leftBehind("with the replicas idle")
	w.mu.Lock()
	for i, p := range w.replicas {
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(time.Minute); code != 0 {
			w.other = append(w.other, fmt.Sprintf("replica %d exited %d at the end", i, code))
		}
	}
	w.mu.Unlock()
	row.leftover += w.leftBehind("with the replicas stopped")

	w.mu.Lock()
	row.other = append(row.other, w.other...)
	infos := append([]string(nil), w.info...)
	w.mu.Unlock()
	sort.Strings(infos)
	if len(infos) > 0 {
		row.other = append(row.other, fmt.Sprintf("(not a failure: %d jobs with identical repeated results)", len(infos)))
	}
	for _, o := range row.other {
		if !strings.HasPrefix(o, "(") {
			t.Errorf("other: %s", o)
		}
	}
}

// allAnswered reports whether every job has a result.
func (w *chaosWorld) allAnswered() bool {
	seen := map[string]bool{}
	msgs, err := w.rdb.XRange(context.Background(), messages.StreamProvisionerResults, "-", "+").Result()
	if err != nil {
		return false
	}
	for _, m := range msgs {
		r, err := messages.DecodeProvisionerResult([]byte(m.Values["data"].(string)))
		if err == nil {
			seen[r.JobID] = true
		}
	}
	for _, id := range w.jobs {
		if !seen[id] {
			return false
		}
	}
	return true
}

// pendingAndUnread counts the queue's entries that some group has not
// acknowledged: pending (delivered, not acknowledged) plus not yet read.
func (w *chaosWorld) pendingAndUnread() int {
	ctx := context.Background()
	groups, err := w.rdb.XInfoGroups(ctx, messages.StreamProvisionerQueue).Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, g := range groups {
		n += int(g.Pending)
		if g.Lag > 0 {
			n += int(g.Lag)
		}
	}
	if len(groups) == 0 {
		return -1
	}
	return n
}

// overlapping counts the pairs of runs on one server whose recorded work
// overlapped. A run whose end was never recorded (its work was killed on
// the target) overlaps nothing.
func overlapping(spans []span) int {
	n := 0
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			a, b := spans[i], spans[j]
			// Sorted by start: b began while a's work still went on.
			if a.end != 0 && b.start < a.end {
				n++
			}
		}
	}
	return n
}

// leftBehind counts processes that still mention the scenario's run root
// or ansible directory (ansible-playbook, runguard, ssh, the work on the
// targets) and run directories still in the run root.
func (w *chaosWorld) leftBehind(when string) int {
	n := 0
	seen := map[int]bool{}
	for _, s := range []string{w.runRoot, w.ansibleDir} {
		for _, pid := range processesMentioning(s) {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			w.t.Errorf("%s: process %d left behind: %s", when, pid, strings.ReplaceAll(string(cmd), "\x00", " "))
			n++
		}
	}
	entries, _ := os.ReadDir(w.runRoot)
	for _, d := range entries {
		w.t.Errorf("%s: run directory left behind: %s", when, filepath.Join(w.runRoot, d.Name()))
		n++
	}
	return n
}
