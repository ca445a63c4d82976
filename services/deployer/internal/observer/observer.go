// Package observer follows the request queue (ansible:deploy:queue)
// read-only for the deployer (OBSERVE_QUEUE): a request another producer
// put there gets a deployment while it is queued, so that it shows in the
// API before its result. It needs only read access to the queue (XREAD,
// no consumer group), so the deployer can neither acknowledge nor hold
// back infra's requests, and a stopped deployer never keeps infra from
// trimming the queue.
package observer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Owner tells the requests this replica published itself (stored
// already), which the observer skips: publishing.Publisher.
type Owner interface {
	Owns(jobID string) bool
}

// Observer follows the request queue and stores the requests of other
// producers as deployments (source "stream").
type Observer struct {
	rdb    stream.Client
	stream string
	db     *pgxpool.Pool
	own    Owner
	log    zerolog.Logger
}

// New returns an Observer of queue that stores into db and skips what own
// published.
func New(rdb stream.Client, queue string, db *pgxpool.Pool, own Owner, log zerolog.Logger) *Observer {
	return &Observer{rdb: rdb, stream: queue, db: db, own: own, log: log}
}

// observePause lets the observer read the queue in batches: under load it
// makes about ten reads a second instead of one per commit group, and
// another producer's request shows in the API at most this much later.
const observePause = 100 * time.Millisecond

// Run starts after the newest request the deployer knows and follows the
// queue until ctx is done.
func (o *Observer) Run(ctx context.Context) error {
	from, err := o.From(ctx)
	for err != nil {
		if ctx.Err() != nil {
			return nil
		}
		o.log.Warn().Err(err).Msg("observer: finding where to start failed; retrying")
		_ = clock.Sleep(ctx, nil, 2*time.Second)
		from, err = o.From(ctx)
	}
	t, err := stream.NewTail(o.rdb, stream.TailConfig{Stream: o.stream, From: from, Pause: observePause, Logger: o.log}, o.Batch)
	if err != nil {
		return err
	}
	o.log.Info().Str("stream", o.stream).Str("from", from).Msg("observer: following the request queue")
	return t.Run(ctx)
}

// From returns where a replica's observer of the request queue
// starts: after the newest request entry the deployer knows of (its own
// or another producer's), so that requests published while every deployer
// was stopped still show while they are queued; the start of the queue
// ("0") when it knows none (a new installation: what is still queued is
// what infra has not finished, and the results consumer reads the results
// stream from its start too). A deployment its result created (the
// request not read yet: no repository) does not count, so that the
// observer still reads its request and fills in the request's fields.
// Reading a little too far back costs nothing: Batch is idempotent.
func (o *Observer) From(ctx context.Context) (string, error) {
	var id string
	// A deployment's entry id is its own mark or its commit group's.
	err := o.db.QueryRow(ctx, `
		SELECT COALESCE(d.request_id, g.entries[d.publish_pos])
		FROM deployments d LEFT JOIN deployment_publish_groups g ON g.id = d.publish_group
		WHERE COALESCE(d.request_id, g.entries[d.publish_pos], '') <> ''
			AND (d.source <> 'stream' OR d.repo_full_name IS NOT NULL)
			-- An Ansible job's entry is of the job queue, not this one.
			AND d.kind = 'deploy'
		ORDER BY d.created_at DESC, d.id DESC LIMIT 1`).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "0", nil
	case err != nil:
		return "", fmt.Errorf("newest request entry: %w", err)
	}
	return id, nil
}

// Batch handles a batch of entries read from the request queue
// (ansible:deploy:queue) by the deployer's read-only observer: a request
// another producer put there gets a deployment (source "stream") while it
// is queued, so it shows in the API before its result; the deployer's own
// requests are there already and change nothing; an entry that is no
// request is left to infra, which rejects it (its result then creates the
// deployment). A deployment its result created first (infra can be quicker
// than the observer's batches) gets the request's fields. The batch is
// stored in one round trip.
func (o *Observer) Batch(ctx context.Context, msgs []*stream.Message) error {
	var batch pgx.Batch
	seen := make(map[string]bool, len(msgs))
	for _, msg := range msgs {
		// Most entries are this replica's own: recognised by their job id
		// alone, without decoding the request.
		if id, ok := messages.PeekString(msg.Data(), "job_id"); ok && o.own.Owns(id) {
			continue
		}
		m, err := messages.DecodeAnsibleDeployMessage(msg.Data())
		if err != nil || m == nil {
			continue
		}
		jobID := m.JobIDOr(msg.ID)
		if o.own.Owns(jobID) || seen[jobID] {
			continue // published by this replica (stored already), or a duplicate entry
		}
		seen[jobID] = true
		var timeout *int
		if m.TimeoutSeconds > 0 {
			timeout = &m.TimeoutSeconds
		}
		batch.Queue(`
			INSERT INTO deployments (id, job_id, source, project_id, repo_full_name, branch, server_ip, port, modules,
				github_token_ref, secrets_ref, correlation_id, timeout_seconds, request_id, published_at)
			SELECT gen_random_uuid(), $1, 'stream', $2, $3, $4, $5, $6, $7, NULLIF($8, ''), NULLIF($9, ''), NULLIF($10, ''), $11, $12, now()
			-- A row with its request (this or another replica's own, or
			-- observed before) is left alone without locking it; only a
			-- row its result created goes on to the conflict's update.
			WHERE NOT EXISTS (SELECT 1 FROM deployments
				WHERE job_id = $1 AND (source <> 'stream' OR repo_full_name IS NOT NULL))
			ON CONFLICT (job_id) DO UPDATE SET
				project_id = COALESCE(deployments.project_id, EXCLUDED.project_id),
				repo_full_name = EXCLUDED.repo_full_name,
				branch = COALESCE(deployments.branch, EXCLUDED.branch),
				server_ip = COALESCE(deployments.server_ip, EXCLUDED.server_ip),
				port = COALESCE(deployments.port, EXCLUDED.port),
				modules = COALESCE(deployments.modules, EXCLUDED.modules),
				github_token_ref = COALESCE(deployments.github_token_ref, EXCLUDED.github_token_ref),
				secrets_ref = COALESCE(deployments.secrets_ref, EXCLUDED.secrets_ref),
				correlation_id = COALESCE(deployments.correlation_id, EXCLUDED.correlation_id),
				timeout_seconds = COALESCE(deployments.timeout_seconds, EXCLUDED.timeout_seconds)
			WHERE deployments.source = 'stream' AND deployments.repo_full_name IS NULL`,
			jobID, m.ProjectID, m.RepoFullName, m.Branch, m.ServerIP, m.Port, m.Modules,
			m.GitHubTokenRef, m.SecretsRef, m.CorrelationID, timeout, msg.ID)
	}
	if batch.Len() == 0 {
		return nil
	}
	// One round trip for the batch, in one implicit transaction.
	if err := o.db.SendBatch(ctx, &batch).Close(); err != nil {
		return fmt.Errorf("store %d observed requests: %w", batch.Len(), err)
	}
	return nil
}
