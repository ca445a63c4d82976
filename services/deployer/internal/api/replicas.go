package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// liveWithin is how recently a consumer of a job queue must have read it
// to count as a live replica: infra's readers block for a second at a time.
const liveWithin = 30 * time.Second

// QueueReader counts a queue's live consumers (stream.Inspector).
type QueueReader interface {
	LiveConsumers(ctx context.Context, stream string, within time.Duration) (int, error)
}

// waiting says why queued job d has not started: no replica serves its
// pool, or it waits in the lines of its busy hosts (then with its place);
// "" when it does not wait, or that cannot be read.
func (a *API) waiting(ctx context.Context, d *deployments.Deployment) (string, *JobQueue) {
	if d.Kind != deployments.KindJob || d.Status != deployments.StatusQueued || d.Job == nil {
		return "", nil
	}
	if why := a.noReplica(ctx, d); why != "" {
		return why, nil
	}
	lines, err := a.deps.Deployments.Lines(ctx, d)
	if err != nil || len(lines) == 0 {
		return "", nil
	}
	q := &JobQueue{Hosts: lines}
	var parts []string
	for _, l := range lines {
		q.Position = max(q.Position, l.Ahead+1)
		state := "free, reserved for runs ahead"
		if l.Busy {
			state = "busy"
		}
		parts = append(parts, fmt.Sprintf("%s (%s, %d ahead)", l.Target, state, l.Ahead))
	}
	if q.Position == 1 && !slices.ContainsFunc(lines, func(l store.LinePlace) bool { return l.Busy }) {
		// Next everywhere and nothing busy: it starts at its next look.
		return "", nil
	}
	return fmt.Sprintf("waiting for its hosts, in arrival order: %s", strings.Join(parts, ", ")), q
}

// noReplica says why queued job d has not started when no replica serves
// its pool ("" otherwise, or when that cannot be read).
func (a *API) noReplica(ctx context.Context, d *deployments.Deployment) string {
	if a.deps.Queues == nil {
		return ""
	}
	pool := d.Job.Options.Pool
	queue := a.deps.Deployments.JobQueue(pool)
	n, err := a.deps.Queues.LiveConsumers(ctx, queue, liveWithin)
	if (err != nil && !errors.Is(err, stream.ErrNotFound)) || n > 0 {
		return ""
	}
	name := "the default pool"
	if pool != "" {
		name = "pool " + pool
	}
	return fmt.Sprintf("no infra replica serves %s: none read %s in the last %s (infra's JOB_POOLS names the pools a replica serves)",
		name, queue, liveWithin)
}

// poolReplicas is the gauge autoprov_deployer_job_pool_replicas{pool}:
// the live replicas of the default pool and of each granted pool, read at
// each scrape; a pool at 0 has jobs that wait for nobody.
type poolReplicas struct {
	desc  *prometheus.Desc
	q     QueueReader
	queue func(pool string) string
	pools []string // "" is the default pool
}

// poolReplicasHelp is the gauge's help text.
const poolReplicasHelp = "Infra replicas that read the job queue of a pool (default: ansible:job:queue) in the last 30 s, read at each scrape; 0: its jobs wait for nobody."

func poolReplicasDesc() *prometheus.Desc {
	return prometheus.NewDesc("autoprov_deployer_job_pool_replicas", poolReplicasHelp, []string{"pool"}, nil)
}

func (p *poolReplicas) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p *poolReplicas) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, pool := range p.pools {
		n, err := p.q.LiveConsumers(ctx, p.queue(pool), liveWithin)
		if err != nil && !errors.Is(err, stream.ErrNotFound) {
			continue // unknown: no sample rather than a false 0
		}
		label := pool
		if label == "" {
			label = "default"
		}
		ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, float64(n), label)
	}
}
