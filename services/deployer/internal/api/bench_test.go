package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// BenchmarkSubmit measures POST /deployments on loopback against a deployer
// with real Postgres and Redis (each request: key check, rate limit,
// validation, then an INSERT and an XADD shared with the submits of the
// same moment: see the publishing package's committer: one multi-row
// INSERT per group, one pipeline of XADDs, one publish mark row), in two ways:
//
//   - at a fixed rate (the goal's figure: BENCH_SUBMIT_RATE requests/s,
//     default 2,000, offered on schedule whatever the answers, up to 256
//     in flight; a latency runs from the moment the request was due, so a
//     stall is charged to every request it delayed), after a second at that
//     rate that is not measured (it opens the connections), metrics
//     at_rate_*;
//   - saturated: 64 keep-alive clients sending one request after the other
//     for 5 s (the most it serves; its latency is tied to the 64 clients by
//     Little's law, so its p99 says little), metrics without a prefix.
//
// Beside them, in the same run, the storage floor (floor_*): one committed
// INSERT and one XADD per request, same 64 workers, no HTTP. Each phase
// also reports the CPU time it cost per request: this process (deployer and
// load generator together), the Postgres backends of the test's database,
// and the Redis server (all of it, shared with other users of that server).
// On these 2-core machines the sum bounds the rate: 2 s of CPU per second.
func BenchmarkSubmit(b *testing.B) {
	e := dt.Start(b, dt.Options{NoInfra: true, Env: map[string]string{
		"API_RATE_LIMIT": "1000000", "API_RATE_BURST": "1000000", "API_KEY_CACHE_TTL": "5s", "LOG_LEVEL": "warn",
	}})
	rate := 2000.0
	if v := os.Getenv("BENCH_SUBMIT_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 {
			b.Fatalf("BENCH_SUBMIT_RATE=%q: want a positive number", v)
		}
		rate = r
	}
	body, _ := json.Marshal(dt.Request())
	const workers = 64
	const inFlight = 256
	const duration = 5 * time.Second
	tr := &http.Transport{MaxIdleConnsPerHost: inFlight, MaxConnsPerHost: inFlight}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	post := func() (time.Duration, error) {
		req, _ := http.NewRequest("POST", e.URL+"/api/v1/deployments", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.CI)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 202 {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	meter := newCPUMeter(e.DB, e.Redis)
	// The floor, side by side in the same run: what the same load of 64
	// workers gets from Postgres and Redis alone (one INSERT committed and
	// one XADD per request, no HTTP, no API).
	floor := storageFloor(b, e, meter, workers, duration)
	// Warm up: pools, caches, and the open loop's connections (the first
	// second at the rate opens most of them); not measured.
	for range 200 {
		if _, err := post(); err != nil {
			b.Fatal(err)
		}
	}
	if w := openLoop(rate, inFlight, time.Second, meter, post); w.failed > 0 {
		b.Fatalf("warm-up: %d requests failed", w.failed)
	}
	b.ResetTimer()
	for range b.N {
		at := openLoop(rate, inFlight, duration, meter, post)
		sat := closedLoop(workers, duration, meter, post)
		for _, r := range []*loadResult{at, sat} {
			if r.failed > 0 || r.done == 0 {
				b.Fatalf("%d requests failed, %d succeeded", r.failed, r.done)
			}
		}
		report(b, "at_rate_", at)
		b.ReportMetric(at.offered, "at_rate_offered_req/s")
		report(b, "", sat)
		report(b, "floor_", floor)
		b.Logf("POST /deployments, %s (load average %s):", b.Name(), loadAverage())
		b.Logf("  %-34s %9s %8s %8s %10s %10s %10s", "phase", "req/s", "p50 ms", "p99 ms", "Go us/req", "PG us/req", "Redis us/req")
		for _, row := range []struct {
			name string
			r    *loadResult
		}{{fmt.Sprintf("offered %.0f/s, open loop", rate), at}, {"saturated, 64 clients", sat}, {"storage floor, 64 workers", floor}} {
			self, pg, rds := row.r.perRequest()
			b.Logf("  %-34s %9.0f %8.1f %8.1f %10.0f %10.0f %10.0f", row.name, row.r.rate(), row.r.pct(0.5), row.r.pct(0.99), self, pg, rds)
		}
	}
	b.StopTimer()
	// Publish marks are one row per commit group (deployment_publish_groups),
	// not an update of each deployment's row.
	var upd, groups, marked int64
	if err := e.DB.QueryRow(context.Background(), `SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'deployments'),
		count(*), COALESCE(sum(cardinality(entries)), 0) FROM deployment_publish_groups`).Scan(&upd, &groups, &marked); err == nil && groups > 0 {
		b.Logf("  publish marks: %d group rows for %d deployments (%.1f per group); updates of deployments rows: %d", groups, marked, float64(marked)/float64(groups), upd)
	}
	// Every accepted request is on the queue.
	var stored int64
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM deployments`).Scan(&stored); err != nil {
		b.Fatal(err)
	}
	if q := e.QueueLen(); q != stored {
		b.Errorf("%d deployments stored, %d published", stored, q)
	}
}

// loadAverage returns the 1-minute load average ("?" when unknown).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// BenchmarkSSEFanout follows one deployment with 1,000 SSE clients while
// 100 progress events are published 10 ms apart, and reports the delay
// from each event's XADD to its arrival at each client (every client must
// get every event).
func BenchmarkSSEFanout(b *testing.B) {
	e := dt.Start(b, dt.Options{NoInfra: true, Env: map[string]string{"LOG_LEVEL": "warn", "API_SSE_HEARTBEAT": "1h"}})
	const clients = 1000
	const events = 100
	for range b.N {
		_, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request())
		d := dt.JSON[deployments.Deployment](b, body)
		tr := &http.Transport{MaxIdleConnsPerHost: clients}
		streams := make([]*dt.SSEStream, clients)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 50)
		for i := range clients {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				streams[i] = e.OpenSSE(b, d.Links.Events, e.CI, "")
			})
		}
		wg.Wait()
		delays := make([][]time.Duration, clients)
		counts := make([]int, clients)
		for i, s := range streams {
			wg.Go(func() {
				for {
					ev, ok := s.Next()
					if !ok {
						return
					}
					var m struct {
						Message string `json:"message"`
					}
					_ = json.Unmarshal([]byte(ev.Data), &m)
					if ns, err := strconv.ParseInt(m.Message, 10, 64); err == nil {
						delays[i] = append(delays[i], time.Since(time.Unix(0, ns)))
					}
					counts[i]++
				}
			})
		}
		b.ResetTimer()
		stream := messages.ProgressStream(messages.JobKindDeploy, d.JobID)
		for seq := 1; seq <= events; seq++ {
			ev := messages.ProgressEvent{JobID: d.JobID, Seq: int64(seq), Time: messages.FormatTime(time.Now()),
				Type: messages.EventTaskStarted, Play: "p", Task: "t", Message: strconv.FormatInt(time.Now().UnixNano(), 10)}
			if seq == events {
				ev.Type, ev.Status, ev.Task, ev.Play = messages.EventRunFinished, messages.StatusSucceeded, "", ""
			}
			data, _ := messages.Encode(&ev)
			if err := e.Redis.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"data": data}}).Err(); err != nil {
				b.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
		b.StopTimer()
		var all []time.Duration
		for i := range clients {
			if counts[i] != events {
				b.Fatalf("client %d got %d of %d events", i, counts[i], events)
			}
			all = append(all, delays[i]...)
		}
		slices.Sort(all)
		pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
		b.ReportMetric(clients, "subscribers")
		b.ReportMetric(float64(len(all)), "deliveries")
		b.ReportMetric(pct(0.50), "p50_ms")
		b.ReportMetric(pct(0.99), "p99_ms")
		b.ReportMetric(pct(1), "max_ms")
		tr.CloseIdleConnections()
	}
}

// storageFloor runs workers that each insert a deployment row and XADD a
// request, as fast as they can for d.
func storageFloor(b *testing.B, e *dt.Env, m *cpuMeter, workers int, d time.Duration) *loadResult {
	ctx := context.Background()
	data, _ := messages.Encode(&messages.AnsibleDeployMessage{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 8080})
	stream := e.Streams.Queue + ":floor"
	r := closedLoop(workers, d, m, func() (time.Duration, error) {
		t0 := time.Now()
		_, err := e.DB.Exec(ctx, `INSERT INTO deployments (id, job_id, source, project_id, repo_full_name, branch, server_ip, port)
			VALUES (gen_random_uuid(), gen_random_uuid()::text, 'stream', 'p', 'acme/shop', 'main', '198.51.100.7', 8080)`)
		if err == nil {
			err = e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"data": data}}).Err()
		}
		return time.Since(t0), err
	})
	e.Redis.Del(ctx, stream)
	if _, err := e.DB.Exec(ctx, `DELETE FROM deployments WHERE source = 'stream'`); err != nil {
		b.Fatal(err)
	}
	if r.failed > 0 || r.done == 0 {
		b.Fatalf("storage floor: %d requests failed, %d succeeded", r.failed, r.done)
	}
	return r
}
