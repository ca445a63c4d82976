package webhooks

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EventDeploymentFinished is sent once when a deployment reaches its final
// state.
const EventDeploymentFinished = "deployment.finished"

// EventJobFinished is EventDeploymentFinished of an Ansible job.
const EventJobFinished = "job.finished"

// Delivery states.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateFailed    = "failed"
)

// NewDelivery describes a webhook to queue.
type NewDelivery struct {
	DeploymentID string
	APIKeyID     string // whose secret signs it; "" for none
	Event        string
	URL          string
	Body         []byte
}

// Enqueue queues a delivery inside tx; it is a no-op when the deployment
// already has one for the event (a result seen twice). retryFor bounds how
// long it is retried.
func Enqueue(ctx context.Context, tx pgx.Tx, d NewDelivery, retryFor time.Duration) error {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return fmt.Errorf("new delivery id: %w", err)
	}
	var keyID *string
	if d.APIKeyID != "" {
		keyID = &d.APIKeyID
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO webhook_deliveries (id, deployment_id, api_key_id, event, url, body, give_up_at)
		VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)
		ON CONFLICT (deployment_id, event) DO NOTHING`,
		id, d.DeploymentID, keyID, d.Event, d.URL, d.Body, retryFor)
	if err != nil {
		return fmt.Errorf("queue webhook: %w", err)
	}
	return nil
}

// Attempt is one recorded attempt of a delivery.
type Attempt struct {
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS float64   `json:"duration_ms"`
	StatusCode int       `json:"status_code,omitempty"`
	// Error is the failed attempt's class (see Classes), never its detail.
	Error string `json:"error,omitempty"`
}

// Delivery is a queued webhook with its attempts, as the API shows it.
type Delivery struct {
	ID            string     `json:"id"`
	Event         string     `json:"event"`
	URL           string     `json:"url"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	GiveUpAt      time.Time  `json:"give_up_at"`
	LastError     string     `json:"last_error,omitempty"` // a class (see Classes)
	CreatedAt     time.Time  `json:"created_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	History       []Attempt  `json:"history"`
}

// ListForDeployment returns the deliveries of a deployment with every
// attempt, oldest first.
func ListForDeployment(ctx context.Context, db *pgxpool.Pool, deploymentID string) ([]Delivery, error) {
	rows, err := db.Query(ctx, `
		SELECT id::text, event, url, state, attempts, next_attempt_at, give_up_at, COALESCE(last_error, ''),
			created_at, finished_at
		FROM webhook_deliveries WHERE deployment_id = $1 ORDER BY created_at`, deploymentID)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var next time.Time
		err := r.Scan(&d.ID, &d.Event, &d.URL, &d.State, &d.Attempts, &next, &d.GiveUpAt, &d.LastError,
			&d.CreatedAt, &d.FinishedAt)
		if d.State == StatePending {
			d.NextAttemptAt = &next
		}
		d.URL = RedactURL(d.URL)
		d.LastError = PublicError(d.LastError)
		d.History = []Attempt{}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	for i := range out {
		rows, err := db.Query(ctx, `SELECT attempt, started_at, duration_ms, COALESCE(status_code, 0), COALESCE(error, '')
			FROM webhook_attempts WHERE delivery_id = $1 ORDER BY attempt`, out[i].ID)
		if err != nil {
			return nil, fmt.Errorf("list webhook attempts: %w", err)
		}
		out[i].History, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
			var a Attempt
			err := r.Scan(&a.Attempt, &a.StartedAt, &a.DurationMS, &a.StatusCode, &a.Error)
			a.Error = PublicError(a.Error)
			return a, err
		})
		if err != nil {
			return nil, fmt.Errorf("list webhook attempts: %w", err)
		}
	}
	return out, nil
}
