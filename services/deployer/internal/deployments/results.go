package deployments

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// ResultsHandler returns the stream handler of deploy:results (group
// "deployer"): each result is recorded once per job; results of jobs the
// deployer did not publish create their deployment (source "stream").
func (s *Service) ResultsHandler() stream.Handler {
	return stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		r, err := messages.DecodeAnsibleDeployResult(msg.Data())
		if err != nil {
			if messages.IsInvalid(err) {
				return stream.Permanent("invalid_result", err)
			}
			return err
		}
		return s.Record(ctx, r)
	})
}

// JobResultsHandler returns the stream handler of job:results: each
// Ansible job's result is recorded as Record does a deployment's.
func (s *Service) JobResultsHandler() stream.Handler {
	return stream.HandlerFunc(func(ctx context.Context, msg *stream.Message) error {
		r, err := messages.DecodeAnsibleJobResult(msg.Data())
		if err != nil {
			if messages.IsInvalid(err) {
				return stream.Permanent("invalid_result", err)
			}
			return err
		}
		return s.RecordJob(ctx, r)
	})
}

// RecordJob stores an Ansible job's result, as Record does.
func (s *Service) RecordJob(ctx context.Context, r *messages.AnsibleJobResult) error {
	res := resultFrom(&r.Outcome)
	res.Commit, res.InventoryCommit, res.Pool = r.Commit, r.InventoryCommit, r.Pool
	res.Artifacts = r.Artifacts
	for _, p := range r.Playbooks {
		res.Playbooks = append(res.Playbooks, PlaybookResult{Playbook: p.Playbook, Status: string(p.Status),
			ErrorKind: string(p.ErrorKind), DurationMS: p.DurationMS})
	}
	return s.record(ctx, outcome{kind: KindJob, o: &r.Outcome, res: res, projectID: r.ProjectID})
}

// outcome is a result to record: its kind, the wire outcome, the result
// as stored, and the request keys a result echoes (for a job the deployer
// did not publish).
type outcome struct {
	kind      string
	o         *messages.Outcome
	res       *Result
	projectID string
	serverIP  string
	port      int
}

// Record stores a job's result: the first result of a job wins (a result
// published again, or a late one after a cancellation, changes nothing).
func (s *Service) Record(ctx context.Context, r *messages.AnsibleDeployResult) error {
	return s.record(ctx, outcome{kind: KindDeploy, o: &r.Outcome, res: resultFrom(&r.Outcome),
		projectID: r.ProjectID, serverIP: r.ServerIP, port: r.Port})
}

func (s *Service) record(ctx context.Context, r outcome) error {
	var changed bool
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		changed, err = s.recordResult(ctx, tx, r)
		return err
	})
	if err != nil {
		return fmt.Errorf("record result of %s: %w", r.o.JobID, err)
	}
	if changed {
		s.afterRecord(ctx, r.o.JobID)
	} else {
		s.metrics.results.WithLabelValues("duplicate").Inc()
	}
	return nil
}

// recordResult does Record's work in tx and reports whether it changed the
// deployment.
func (s *Service) recordResult(ctx context.Context, tx pgx.Tx, out outcome) (bool, error) {
	r, res := out.o, out.res
	status := Status(r.Status)
	if !status.Terminal() || !status.Valid() {
		return false, stream.Permanent("invalid_result", fmt.Errorf("status %q is not final", r.Status))
	}
	var kind *string
	if r.Error != nil {
		k := string(r.Error.Kind)
		kind = &k
	}
	finished := s.now()
	if t, err := messages.ParseTime(r.FinishedAt); err == nil {
		finished = t
	}
	// The result goes on the job's queued deployment. When there is none
	// the job is either final already or unknown (another producer put it
	// on the queue straight away): then it creates the deployment, unless
	// the observer stores the queued request in the meantime (the INSERT
	// then conflicts), in which case the UPDATE, run again, sees that row.
	var id string
	for attempt := 0; ; attempt++ {
		err := tx.QueryRow(ctx, `
			UPDATE deployments SET status = $2, result = $3, error_kind = $4, finished_at = $5, updated_at = now(),
				request_id = COALESCE(request_id, NULLIF($6, ''))
			WHERE job_id = $1 AND status = 'queued' AND kind = $7
			RETURNING id::text`, r.JobID, string(status), mustJSON(res), kind, finished, r.RequestID, out.kind).Scan(&id)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		if attempt > 0 {
			return false, nil // already final: a duplicate
		}
		newID, err := uuid.NewV7FromReader(rand.Reader)
		if err != nil {
			return false, err
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO deployments (id, job_id, source, status, project_id, server_ip, port, correlation_id,
				request_id, published_at, result, error_kind, finished_at, kind)
			VALUES ($1, $2, 'stream', $3, NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, 0), NULLIF($7, ''),
				NULLIF($8, ''), now(), $9, $10, $11, $12)
			ON CONFLICT (job_id) DO NOTHING`,
			newID, r.JobID, string(status), out.projectID, out.serverIP, out.port, r.CorrelationID,
			r.RequestID, mustJSON(res), kind, finished, out.kind)
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() == 1 {
			s.metrics.results.WithLabelValues("foreign").Inc()
			return true, nil
		}
	}
	s.metrics.results.WithLabelValues(string(status)).Inc()
	// The webhook goes out with the state it reports, or not at all.
	var callback, keyID string
	if err := tx.QueryRow(ctx, `SELECT COALESCE(callback_url, ''), COALESCE(api_key_id::text, '') FROM deployments WHERE id = $1`,
		id).Scan(&callback, &keyID); err != nil {
		return false, err
	}
	if callback != "" {
		d, err := getDeployment(ctx, tx, "d.id = $1", id)
		if err != nil {
			return false, err
		}
		event := webhooks.EventDeploymentFinished
		if d.Kind == KindJob {
			event = webhooks.EventJobFinished
		}
		body := mustJSON(WebhookBody{Event: event, SentFor: id, Deployment: d})
		if err := webhooks.Enqueue(ctx, tx, webhooks.NewDelivery{
			DeploymentID: id, APIKeyID: keyID, Event: event, URL: callback, Body: body,
		}, s.cfg.WebhookRetryFor); err != nil {
			return false, err
		}
	}
	return true, nil
}

// afterRecord announces a final state and wakes the webhook deliverer.
func (s *Service) afterRecord(ctx context.Context, jobID string) {
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.notifier.Publish(nctx, jobID)
	if s.cfg.OnWebhook != nil {
		s.cfg.OnWebhook()
	}
}
