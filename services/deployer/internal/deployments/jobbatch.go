package deployments

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// Submitted is one job of SubmitJobs: its submission, or why it was not
// made (ErrIdempotencyMismatch: its key was used for another request).
type Submitted struct {
	Submission *Submission
	Err        error
}

// SubmitJobs submits r once per Idempotency-Key of keys, made with the
// API key keyID, which sees v: each as SubmitJob would, but r is checked
// once, the new jobs are stored in one transaction and published in one
// round trip. It is how many occurrences of one schedule batch are
// launched. An error of r (invalid, a project outside v) or of the store
// is returned for all; a key used before replays its job, or is
// ErrIdempotencyMismatch in its own Submitted.
func (s *Service) SubmitJobs(ctx context.Context, keyID string, v Visibility, r JobRequest, keys []string) ([]Submitted, error) {
	now := s.now()
	msg, err := s.jobMessage(ctx, &r, v, uuid.Nil.String(), now)
	if err != nil {
		return nil, err
	}
	queue := s.JobQueue(r.Options.Pool)
	sctx, span := tracing.StartPublish(ctx, s.cfg.Tracing, queue, attribute.Int("autoprov.jobs", len(keys)))
	defer span.End()
	msg.TraceContext = tracing.Inject(sctx)
	stored := r
	stored.Options.CallbackURL = "" // its own column
	request := mustJSON(stored)
	hash := requestHash(jobHashed(r))
	out := make([]Submitted, len(keys))
	rows := make([]*Row, len(keys))
	data := make([][]byte, len(keys))
	for i := range keys {
		id, err := uuid.NewV7FromReader(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("new job id: %w", err)
		}
		// The message of each job is the one checked above, with its id.
		m := *msg
		m.JobID = id.String()
		if data[i], err = messages.Encode(&m); err != nil {
			return nil, fmt.Errorf("encode job request: %w", err)
		}
		rows[i] = &Row{ID: id.String(), KeyID: keyID, ProjectID: r.ProjectID, CorrelationID: r.CorrelationID,
			TimeoutSeconds: r.Options.Timeout, CallbackURL: r.Options.CallbackURL, CreatedAt: now,
			Kind: KindJob, JobRequest: request, Queue: queue}
	}
	existing, err := s.storeJobsWithKeys(ctx, keyID, rows, keys, hash)
	if err != nil {
		return nil, fmt.Errorf("store jobs: %w", err)
	}
	var fresh []int
	for i := range keys {
		switch e, ok := existing[keys[i]]; {
		case !ok:
			fresh = append(fresh, i)
		case e.mismatch:
			out[i].Err = ErrIdempotencyMismatch
		default:
			out[i].Submission, out[i].Err = s.replay(ctx, v, e.id)
		}
	}
	ids, batch := make([]string, len(fresh)), make([][]byte, len(fresh))
	for j, i := range fresh {
		ids[j], batch[j] = rows[i].ID, data[i]
	}
	entries := s.publisher.PublishStoredBatch(ctx, ids, queue, batch)
	for j, i := range fresh {
		s.metrics.submitted.WithLabelValues("new").Inc()
		out[i].Submission = &Submission{Deployment: newJob(rows[i].ID, keyID, queue, entries[j], r, &stored, now)}
	}
	return out, nil
}

// usedKey is an Idempotency-Key found stored: its job, or a request
// other than the one given.
type usedKey struct {
	id       string
	mismatch bool
}

// storeJobsWithKeys stores rows[i] with the Idempotency-Key keys[i] of
// the API key keyID, as storeWithKey does each, in one transaction; it
// returns the keys used already (their rows are not stored).
func (s *Service) storeJobsWithKeys(ctx context.Context, keyID string, rows []*Row, keys []string, hash []byte) (map[string]usedKey, error) {
	locks := make([]int64, len(keys))
	for i, k := range keys {
		locks[i] = idemLockKey(keyID, k)
	}
	slices.Sort(locks) // batches that share keys take them in one order
	used := map[string]usedKey{}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k ORDER BY k`, locks); err != nil {
			return err
		}
		found, err := tx.Query(ctx, `SELECT key, request_hash, deployment_id::text FROM idempotency_keys
			WHERE api_key_id = $1 AND key = ANY($2) AND ($3::interval IS NULL OR created_at >= now() - $3::interval)`,
			keyID, keys, s.idempotencyTTL())
		if err != nil {
			return err
		}
		var key, id string
		var prev []byte
		if _, err := pgx.ForEachRow(found, []any{&key, &prev, &id}, func() error {
			used[key] = usedKey{id: id, mismatch: string(prev) != string(hash)}
			return nil
		}); err != nil {
			return err
		}
		b := &pgx.Batch{}
		for i, r := range rows {
			if _, ok := used[keys[i]]; ok {
				continue
			}
			b.Queue(insertDeployment, r.args("", 0)...)
			b.Queue(`INSERT INTO idempotency_keys (api_key_id, key, request_hash, deployment_id) VALUES ($1, $2, $3, $4)
				ON CONFLICT (api_key_id, key) DO UPDATE
				SET request_hash = EXCLUDED.request_hash, deployment_id = EXCLUDED.deployment_id, created_at = now()`,
				keyID, keys[i], hash, r.ID)
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, err
	}
	return used, nil
}
