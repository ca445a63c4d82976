package api

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// queues is a QueueReader of fixed answers.
type queues map[string]int

func (q queues) LiveConsumers(_ context.Context, s string, _ time.Duration) (int, error) {
	n, ok := q[s]
	if !ok {
		return 0, stream.ErrNotFound
	}
	return n, nil
}

// The gauge has a sample per pool: the default one, a served pool and a
// pool whose queue does not exist yet (0: nobody serves it).
func TestPoolReplicasGauge(t *testing.T) {
	p := &poolReplicas{
		q:     queues{"ansible:job:queue": 2, "ansible:job:queue:gpu": 1},
		queue: func(pool string) string { return strings.TrimSuffix("ansible:job:queue:"+pool, ":") },
		pools: []string{"", "gpu", "arm"},
	}
	p.desc = poolReplicasDesc()
	want := `
# HELP autoprov_deployer_job_pool_replicas ` + poolReplicasHelp + `
# TYPE autoprov_deployer_job_pool_replicas gauge
autoprov_deployer_job_pool_replicas{pool="arm"} 0
autoprov_deployer_job_pool_replicas{pool="default"} 2
autoprov_deployer_job_pool_replicas{pool="gpu"} 1
`
	if err := testutil.CollectAndCompare(p, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
