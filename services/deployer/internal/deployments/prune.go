package deployments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// pruneBatch is how many rows one statement of Prune deletes: small
// enough that no statement holds its locks for long.
const pruneBatch = 5000

// Pruned counts what one Prune deleted.
type Pruned struct {
	Deployments     int64 // finished deployments (with their webhook deliveries and attempts)
	Groups          int64 // commit groups' publish marks, once none of their deployments is left
	IdempotencyKeys int64 // Idempotency-Keys past their time to live
}

// pruneDeployments deletes one batch of deployments that finished before
// $1, and the publish marks of the groups this leaves empty; it returns
// both counts. Queued deployments are never deleted. The deleted members
// of each group are counted on its row (pruned); a group goes when that
// count reaches its stored members (its non-empty entries). The group rows
// deleted and the ones updated are disjoint: one statement never changes a
// row twice. Two such statements must not run at once (each would count
// from its own snapshot and miss the other's increment): Prune runs each
// under pruneLock. A finished deployment never changes status or
// finished_at again, so rows picked by the inner SELECT still qualify when
// deleted.
const pruneDeployments = `
	WITH gone AS (
		DELETE FROM deployments WHERE id IN (
			SELECT id FROM deployments
			WHERE status IN ('succeeded', 'failed', 'unreachable', 'rejected', 'cancelled')
				AND created_at < $1 AND finished_at < $1
			LIMIT $2)
		RETURNING publish_group),
	counts AS (
		SELECT publish_group AS id, count(*) AS n FROM gone WHERE publish_group IS NOT NULL GROUP BY 1),
	dropped AS (
		DELETE FROM deployment_publish_groups g USING counts c
		WHERE g.id = c.id AND g.pruned + c.n >= cardinality(array_remove(g.entries, ''))
		RETURNING g.id),
	counted AS (
		UPDATE deployment_publish_groups g SET pruned = g.pruned + c.n FROM counts c
		WHERE g.id = c.id AND g.pruned + c.n < cardinality(array_remove(g.entries, '')))
	SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM dropped)`

// pruneIdempotencyKeys deletes one batch of Idempotency-Keys made before $1.
// The outer test of created_at matters: a key that Submit renews while this
// statement waits for its row is re-checked on the new version, and kept.
const pruneIdempotencyKeys = `
	DELETE FROM idempotency_keys WHERE (api_key_id, key) IN (
		SELECT api_key_id, key FROM idempotency_keys WHERE created_at < $1 LIMIT $2)
		AND created_at < $1`

// pruneLock is the advisory lock key under which a replica deletes a batch
// of deployments: one replica at a time, the others skip the batch.
var pruneLock = store.AdvisoryKey("deployer:prune")

// Prune applies the retention: it deletes the deployments that finished
// more than keep ago (0: none), with their webhook deliveries and the
// publish marks of their groups, and the Idempotency-Keys of submits made
// more than the service's IdempotencyTTL ago (0: none; a key also goes
// with its deployment). It works in batches until nothing is left or ctx
// ends; while one replica deletes deployments, the others leave them to
// it.
func (s *Service) Prune(ctx context.Context, keep time.Duration) (Pruned, error) {
	var p Pruned
	now := s.now()
	if keep > 0 {
		for {
			var n, g int64
			locked := false
			err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, pruneLock).Scan(&locked); err != nil || !locked {
					return err
				}
				return tx.QueryRow(ctx, pruneDeployments, now.Add(-keep), pruneBatch).Scan(&n, &g)
			})
			if err != nil {
				return p, fmt.Errorf("delete old deployments: %w", err)
			}
			if !locked {
				break // another replica is deleting them
			}
			p.Deployments, p.Groups = p.Deployments+n, p.Groups+g
			if n < pruneBatch {
				break
			}
		}
	}
	if ttl := s.cfg.IdempotencyTTL; ttl > 0 {
		for {
			tag, err := s.db.Exec(ctx, pruneIdempotencyKeys, now.Add(-ttl), pruneBatch)
			if err != nil {
				return p, fmt.Errorf("delete old idempotency keys: %w", err)
			}
			p.IdempotencyKeys += tag.RowsAffected()
			if tag.RowsAffected() < pruneBatch {
				break
			}
		}
	}
	return p, nil
}
