package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// TestObservedRequestsShowWhileQueued: a request another producer puts on
// the queue shows as a queued deployment before any result (infra is
// stopped here), also one published while the deployer was stopped, and
// the observer took nothing from infra: no consumer group of the
// deployer's on the queue, every entry still there for infra.
func TestObservedRequestsShowWhileQueued(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	ctx := context.Background()
	publish := func(job string) {
		t.Helper()
		m := &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{JobID: job},
			ProjectID:   "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.9", Port: 80,
			Modules: []string{"web"}, TimeoutSeconds: 120,
		}
		data, err := messages.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: e.Streams.Queue, Values: map[string]any{"data": data}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	queued := func(env *dt.Env, job string) *deployments.Deployment {
		t.Helper()
		var page api.DeploymentList
		testenv.WaitFor(t, 30*time.Second, job+" to show as queued", func() bool {
			_, body := env.Do("GET", "/api/v1/deployments?job_id="+job, e.CI, nil)
			page = dt.JSON[api.DeploymentList](t, body)
			return len(page.Items) == 1
		})
		d := page.Items[0]
		if d.Status != deployments.StatusQueued || d.Source != "stream" || d.RequestID == "" ||
			d.Request.RepoFullName != "acme/shop" || d.Request.ServerIP != "198.51.100.9" {
			t.Fatalf("observed deployment %s: %+v", job, d)
		}
		return d
	}

	publish("agent-queued-1")
	queued(e, "agent-queued-1")
	// An entry that is no request is left to infra.
	if err := e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: e.Streams.Queue, Values: map[string]any{"data": "garbage"}}).Err(); err != nil {
		t.Fatal(err)
	}

	// The deployer's own submit, the newest request it knows.
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, dt.Request())
	if resp.StatusCode != 202 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	own := dt.JSON[deployments.Deployment](t, body)
	testenv.WaitFor(t, 30*time.Second, "the submit's publish mark", func() bool {
		_, body := e.Do("GET", "/api/v1/deployments/"+own.ID, e.CI, nil)
		own = dt.JSON[deployments.Deployment](t, body)
		return own.RequestID != ""
	})

	e.Stop()
	publish("agent-queued-2") // while no deployer runs
	e2 := dt.Start(t, dt.Options{NoInfra: true, DB: e.DB, Redis: e.Redis, Streams: e.Streams})
	// It resumes after the newest request it knows, not from the start.
	testenv.WaitFor(t, 30*time.Second, "the observer to start", func() bool {
		return strings.Contains(e2.Logs.String(), `"from":"`+own.RequestID+`"`)
	})
	queued(e2, "agent-queued-2")
	publish("agent-queued-3")
	queued(e2, "agent-queued-3")

	groups, err := e.Redis.XInfoGroups(ctx, e.Streams.Queue).Result()
	if err != nil && err.Error() != "ERR no such key" {
		t.Fatal(err)
	}
	if len(groups) != 0 {
		t.Errorf("the deployer opened consumer groups on the request queue: %+v", groups)
	}
	if n, err := e.Redis.XLen(ctx, e.Streams.Queue).Result(); err != nil || n != 5 {
		t.Errorf("queue length %d (%v), want the 5 entries still there for infra", n, err)
	}
	// Once infra runs, the observed deployments end like any other.
	e2.StartInfra()
	for _, job := range []string{"agent-queued-1", "agent-queued-2", "agent-queued-3"} {
		testenv.WaitFor(t, 30*time.Second, job+" to finish", func() bool {
			_, body := e2.Do("GET", "/api/v1/deployments/"+job, e.CI, nil)
			return dt.JSON[deployments.Deployment](t, body).Status == deployments.StatusSucceeded
		})
	}
	// Three requests and the garbage entry (infra's rejection of it
	// creates its deployment), each once. The garbage has no project:
	// only a fleet-wide key sees it.
	var page api.DeploymentList
	testenv.WaitFor(t, 30*time.Second, "the garbage entry's rejection", func() bool {
		_, body := e2.Do("GET", "/api/v1/deployments?source=stream", e.Admin, nil)
		page = dt.JSON[api.DeploymentList](t, body)
		return len(page.Items) >= 4
	})
	jobs := map[string]bool{}
	for _, d := range page.Items {
		jobs[d.JobID] = true
	}
	if len(page.Items) != 4 || len(jobs) != 4 {
		t.Errorf("stream deployments: %d for %d jobs, want 4 (no duplicates)", len(page.Items), len(jobs))
	}
}
