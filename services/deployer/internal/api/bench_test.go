package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// BenchmarkSubmit measures POST /deployments on loopback: a load generator
// of 64 keep-alive connections sends requests for 5 s against a deployer
// with real Postgres and Redis (each request: key check, rate limit in
// Redis, validation, then an INSERT and an XADD shared with the submits of
// the same moment: see the deployments package's committer). It reports
// requests per second and latency percentiles to the 202, and the storage
// floor side by side: one committed INSERT and one XADD per request, same
// workers, no HTTP. The generator and the deployer share this machine's
// cores.
func BenchmarkSubmit(b *testing.B) {
	e := dt.Start(b, dt.Options{NoInfra: true, Env: map[string]string{
		"API_RATE_LIMIT": "1000000", "API_RATE_BURST": "1000000", "API_KEY_CACHE_TTL": "5s", "LOG_LEVEL": "warn",
	}})
	body, _ := json.Marshal(dt.Request())
	const workers = 64
	const duration = 5 * time.Second
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
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
	// The floor, side by side in the same run: what the same load of 64
	// workers gets from Postgres and Redis alone (one INSERT committed and
	// one XADD per request, no HTTP, no API).
	floorRate, floorP99 := storageFloor(b, e, workers, duration)
	for range 200 { // warm up connections and pools
		if _, err := post(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		var lat [workers][]time.Duration
		var failed atomic.Int64
		deadline := time.Now().Add(duration)
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					d, err := post()
					if err != nil {
						failed.Add(1)
						continue
					}
					lat[w] = append(lat[w], d)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		slices.Sort(all)
		if failed.Load() > 0 || len(all) == 0 {
			b.Fatalf("%d requests failed", failed.Load())
		}
		pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
		b.ReportMetric(float64(len(all))/took.Seconds(), "req/s")
		b.ReportMetric(pct(0.50), "p50_ms")
		b.ReportMetric(pct(0.99), "p99_ms")
		b.ReportMetric(pct(0.999), "p99.9_ms")
		b.ReportMetric(floorRate, "floor_req/s")
		b.ReportMetric(floorP99, "floor_p99_ms")
	}
	b.StopTimer()
	// Every accepted request is on the queue.
	var stored int64
	if err := e.DB.QueryRow(context.Background(), `SELECT count(*) FROM deployments`).Scan(&stored); err != nil {
		b.Fatal(err)
	}
	if q := e.QueueLen(); q != stored {
		b.Errorf("%d deployments stored, %d published", stored, q)
	}
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
		stream := messages.ProgressStream(d.JobID)
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
// request, as fast as they can for d, and returns the rate and p99 (ms).
func storageFloor(b *testing.B, e *dt.Env, workers int, d time.Duration) (float64, float64) {
	ctx := context.Background()
	data, _ := messages.Encode(&messages.AnsibleDeployMessage{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 8080})
	stream := e.Streams.Queue + ":floor"
	var mu sync.Mutex
	var all []time.Duration
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				_, err := e.DB.Exec(ctx, `INSERT INTO deployments (id, job_id, source, project_id, repo_full_name, branch, server_ip, port)
					VALUES (gen_random_uuid(), gen_random_uuid()::text, 'stream', 'p', 'acme/shop', 'main', '198.51.100.7', 8080)`)
				if err == nil {
					err = e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"data": data}}).Err()
				}
				if err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	e.Redis.Del(ctx, stream)
	if _, err := e.DB.Exec(ctx, `DELETE FROM deployments WHERE source = 'stream'`); err != nil {
		b.Fatal(err)
	}
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatal("no floor requests")
	}
	return float64(len(all)) / took.Seconds(), float64(all[int(0.99*float64(len(all)-1))].Microseconds()) / 1000
}
