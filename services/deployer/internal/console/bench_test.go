package console_test

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// seedFleet fills the database as a large installation: servers servers
// (labelled, in every status), deployments deployments, jobs Ansible jobs
// and runs provisioning runs over the last two days, some finished, some
// running.
func seedFleet(tb testing.TB, e *deployertest.Env, servers, deployments, jobs, runs int) {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	for _, q := range []struct {
		sql string
		n   int
	}{
		{`INSERT INTO servers (handle, address, status, labels, source)
			SELECT 'srv-' || i, '10.' || (i / 65536) || '.' || (i / 256 % 256) || '.' || (i % 256),
				(ARRAY['NEW','QUEUED','PROVISIONING','READY','FAILED','UNREACHABLE','ORPHANED'])[1 + i % 7],
				jsonb_build_object('role', (ARRAY['web','db','cache'])[1 + i % 3], 'rack', 'r' || (i % 40)),
				(ARRAY['inventory','time4vps'])[1 + i % 2]
			FROM generate_series(1, $1) i`, servers},
		{`INSERT INTO deployments (id, job_id, source, status, project_id, repo_full_name, branch, server_ip, port, created_at, finished_at)
			SELECT gen_random_uuid(), 'job-d-' || i, 'api',
				(ARRAY['succeeded','failed','succeeded','cancelled','queued','unreachable'])[1 + i % 6],
				'` + deployertest.Project + `', 'acme/app-' || (i % 50), 'main', '198.51.100.' || (i % 250), 8080,
				now() - (i || ' seconds')::interval * 1.7, CASE WHEN i % 6 <> 4 THEN now() - (i || ' seconds')::interval * 1.7 + interval '40 seconds' END
			FROM generate_series(1, $1) i`, deployments},
		{`INSERT INTO deployments (id, job_id, source, status, project_id, repo_full_name, branch, server_ip, port, kind, job_request, created_at, finished_at)
			SELECT id, id::text, 'api', (ARRAY['succeeded','failed','succeeded','cancelled','queued','unreachable'])[1 + i % 6],
				'` + deployertest.Project + `', '', '', '', 0, 'job',
				jsonb_build_object('project_id', '` + deployertest.Project + `',
					'source', jsonb_build_object('type', 'playbook', 'repository', 'https://git.example.com/org/ops-' || (i % 20) || '.git', 'paths', jsonb_build_array('site.yml')),
					'inventory', jsonb_build_object('type', 'inline', 'hosts', jsonb_build_object('web-' || (i % 30), '{}'::jsonb)),
					'credentials', jsonb_build_object('ssh', 'ssh'), 'options', '{}'::jsonb),
				now() - (i || ' seconds')::interval * 1.3, CASE WHEN i % 6 <> 4 THEN now() - (i || ' seconds')::interval * 1.3 + interval '25 seconds' END
			FROM (SELECT i, gen_random_uuid() AS id FROM generate_series(1, $1) i) g`, jobs},
		{`INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, playbook, state, status, created_at, started_at, finished_at)
			SELECT 'job-p-' || i, 'provision', 'provisioner:queue', '1-' || i, 'srv-' || (1 + i % $2), 'srv-' || (1 + i % $2), 'setup_server.yml',
				CASE WHEN i % 10 = 0 THEN 'running' ELSE 'done' END,
				CASE WHEN i % 10 = 0 THEN NULL WHEN i % 7 = 0 THEN 'failed' ELSE 'succeeded' END,
				now() - (i || ' seconds')::interval * 1.7, now() - (i || ' seconds')::interval * 1.7,
				CASE WHEN i % 10 <> 0 THEN now() - (i || ' seconds')::interval * 1.7 + interval '3 minutes' END
			FROM generate_series(1, $1) i`, runs},
	} {
		args := []any{q.n}
		if regexp.MustCompile(`\$2`).MatchString(q.sql) {
			args = append(args, servers)
		}
		if _, err := e.DB.Exec(ctx, q.sql, args...); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := e.DB.Exec(ctx, `VACUUM ANALYZE servers, deployments, runs`); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("seeded %d servers, %d deployments, %d jobs, %d provisioning runs in %s", servers, deployments, jobs, runs,
		time.Since(start).Round(time.Millisecond))
}

// BenchmarkConsolePages times each page of the console, signed in as an
// admin, with 10,000 servers and 200,000 runs in the database (70,000
// deployments, 70,000 Ansible jobs, 60,000 provisioning runs). Each page
// must load under 100 ms: its queries are paged, none per row.
func BenchmarkConsolePages(b *testing.B) {
	e := deployertest.Start(b, deployertest.Options{NoInfra: true,
		Env: map[string]string{"API_RATE_LIMIT": "1000000", "API_RATE_BURST": "1000000"}})
	seedFleet(b, e, 10_000, 70_000, 70_000, 60_000)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	page := func(path string) string {
		res, err := c.Get(e.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		body := make([]byte, 0, 64<<10)
		buf := make([]byte, 32<<10)
		for {
			n, err := res.Body.Read(buf)
			body = append(body, buf[:n]...)
			if err != nil {
				break
			}
		}
		if res.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d\n%s", path, res.StatusCode, body)
		}
		return string(body)
	}
	signin := page("/ui/signin")
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(signin)[1]
	res, err := c.PostForm(e.URL+"/ui/signin", url.Values{"csrf": {csrf}, "key": {e.Admin}})
	if err != nil || res.StatusCode != http.StatusOK {
		b.Fatalf("sign in: %v %v", res.StatusCode, err)
	}
	res.Body.Close()
	var deployment, run string
	if err := e.DB.QueryRow(context.Background(), `SELECT id::text FROM deployments WHERE job_id = 'job-d-7'`).Scan(&deployment); err != nil {
		b.Fatal(err)
	}
	run = "job-p-7"
	var job string
	if err := e.DB.QueryRow(context.Background(), `SELECT id::text FROM deployments WHERE kind = 'job' ORDER BY created_at DESC OFFSET 7 LIMIT 1`).Scan(&job); err != nil {
		b.Fatal(err)
	}
	runsPage := page("/ui/runs")
	next := regexp.MustCompile(`href="(/ui/runs\?cursor=[^"]+)" id="next-page"`).FindStringSubmatch(runsPage)
	if next == nil {
		b.Fatal("the runs page has no next page")
	}
	nextRuns := regexp.MustCompile(`&amp;`).ReplaceAllString(next[1], "&")
	for _, p := range []struct{ name, path string }{
		{"overview", "/ui/"},
		{"fleet", "/ui/fleet"},
		{"fleet-filtered", "/ui/fleet?status=READY&label=role%3Dweb&search=srv-9"},
		{"fleet-page2", "/ui/fleet?cursor=srv-5000"},
		{"server", "/ui/fleet/srv-7"},
		{"runs", "/ui/runs"},
		{"runs-page2", nextRuns},
		{"runs-failed", "/ui/runs?status=failed"},
		{"deployment", "/ui/runs/deployment/" + deployment},
		{"provisioning-run", "/ui/runs/provision/" + run},
		{"job", "/ui/runs/job/" + job},
		{"job-form", "/ui/job"},
		{"job-run-again", "/ui/job?from=" + job},
		{"fleet-by-attempts", "/ui/fleet?sort=attempts"},
		{"deploy-form", "/ui/deploy"},
		{"queues", "/ui/queues"},
		{"keys", "/ui/keys"},
		{"credentials", "/ui/credentials"},
	} {
		b.Run(p.name, func(b *testing.B) {
			var worst time.Duration
			for b.Loop() {
				t0 := time.Now()
				page(p.path)
				worst = max(worst, time.Since(t0))
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		})
	}
}
