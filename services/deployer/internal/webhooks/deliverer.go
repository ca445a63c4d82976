package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
)

// Config configures a Deliverer. Zero values take the defaults.
type Config struct {
	// SigningKey derives each API key's webhook secret (DeriveSecret).
	SigningKey []byte
	// Client sends the requests; build it with Guard.NewClient.
	Client *http.Client
	// Workers is how many deliveries run at once. Default 4.
	Workers int
	// Poll is how often the queue is checked when nothing woke the
	// deliverer. Default 1s.
	Poll time.Duration
	// Lease is how long a claimed delivery is reserved for its worker; a
	// delivery whose worker died is tried again after it. Default 1m.
	Lease time.Duration
	// BackoffMin and BackoffMax bound the delay between attempts, which
	// doubles with each (with jitter). Defaults 5s and 1h.
	BackoffMin, BackoffMax time.Duration
	Logger                 zerolog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Deliverer sends queued webhooks. Run it on every replica: deliveries are
// claimed with FOR UPDATE SKIP LOCKED, so each is sent by one at a time.
type Deliverer struct {
	db   *pgxpool.Pool
	cfg  Config
	log  zerolog.Logger
	wake chan struct{}
	now  func() time.Time

	attempts *prometheus.CounterVec
}

// NewDeliverer returns a Deliverer on db.
func NewDeliverer(db *pgxpool.Pool, cfg Config) (*Deliverer, error) {
	if len(cfg.SigningKey) == 0 {
		return nil, errors.New("webhooks: no signing key")
	}
	if cfg.Client == nil {
		return nil, errors.New("webhooks: no HTTP client")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Minute
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 5 * time.Second
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(time.Hour, cfg.BackoffMin)
	}
	d := &Deliverer{
		db: db, cfg: cfg, log: cfg.Logger.With().Str("component", "webhooks").Logger(),
		wake: make(chan struct{}, 1), now: time.Now,
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_deployer_webhook_attempts_total",
			Help: "Webhook delivery attempts by outcome (delivered, retry, failed; stale: it outlived its lease and another attempt holds the delivery).",
		}, []string{"outcome"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(d.attempts); err != nil {
			return nil, fmt.Errorf("webhooks: metrics: %w", err)
		}
	}
	return d, nil
}

// Notify wakes the deliverer: a delivery was queued.
func (d *Deliverer) Notify() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx is done, then lets attempts in flight finish.
func (d *Deliverer) Run(ctx context.Context) error {
	sem := make(chan struct{}, d.cfg.Workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		free := d.cfg.Workers - len(sem)
		if free > 0 {
			jobs, err := d.claim(ctx, free)
			if err != nil && ctx.Err() == nil {
				d.log.Warn().Err(err).Msg("claim webhooks")
			}
			for _, j := range jobs {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem; d.Notify() }()
					// An attempt in flight is finished even during shutdown:
					// its outcome is recorded, not lost.
					d.deliver(context.WithoutCancel(ctx), j)
				})
			}
			if len(jobs) == free {
				continue // more may be due
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-d.wake:
		case <-t.C:
		}
	}
}

type job struct {
	id, keyID, event, url string
	body                  []byte
	attempt               int
	giveUpAt              time.Time
}

// claim reserves up to n due deliveries for Lease and counts the attempt.
func (d *Deliverer) claim(ctx context.Context, n int) ([]job, error) {
	rows, err := d.db.Query(ctx, `
		UPDATE webhook_deliveries SET locked_until = now() + $2::interval, attempts = attempts + 1
		WHERE id IN (
			SELECT id FROM webhook_deliveries
			WHERE state = 'pending' AND next_attempt_at <= now() AND (locked_until IS NULL OR locked_until < now())
			ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id::text, COALESCE(api_key_id::text, ''), event, url, body, attempts, give_up_at`, n, d.cfg.Lease)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		err := r.Scan(&j.id, &j.keyID, &j.event, &j.url, &j.body, &j.attempt, &j.giveUpAt)
		return j, err
	})
}

// maxErrorLen bounds the error text stored with an attempt.
const maxErrorLen = 500

func (d *Deliverer) deliver(ctx context.Context, j job) {
	log := d.log.With().Str("delivery_id", j.id).Int("attempt", j.attempt).Logger()
	started := d.now()
	code, err := d.send(ctx, j, started)
	took := d.now().Sub(started)
	// The stored error, which API readers see, is a class (ErrorClass);
	// the detail (the address a name resolved to, ...) goes to the logs.
	var class, detail string
	if err != nil {
		class, detail = ErrorClass(err, 0), err.Error()
		if len(detail) > maxErrorLen {
			detail = detail[:maxErrorLen]
		}
	}
	var outcome string
	var next time.Time
	switch {
	case err == nil && code >= 200 && code < 300:
		outcome = StateDelivered
	case err == nil && code == http.StatusGone:
		outcome, class, detail = StateFailed, ClassGone, "the receiver answered 410 Gone: not retried"
	default:
		if class == "" {
			class, detail = ErrorClass(nil, code), fmt.Sprintf("the receiver answered %d", code)
		}
		next = d.now().Add(d.backoff(j.attempt))
		outcome = StatePending
		if next.After(j.giveUpAt) {
			outcome = StateFailed
			detail += "; retries exhausted"
		}
	}
	stale := false
	err = pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		var status *int
		if code > 0 {
			status = &code
		}
		var e *string
		if class != "" {
			e = &class
		}
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
			j.id, j.attempt, started, float64(took.Microseconds())/1000, status, e); err != nil {
			return err
		}
		// Only while this attempt holds the delivery: once its lease ran
		// out another replica may have claimed it (attempts went up) and
		// delivered it; this late outcome must not undo that.
		tag, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = $2, locked_until = NULL, last_error = $3,
				next_attempt_at = COALESCE($4, next_attempt_at),
				finished_at = CASE WHEN $2 = 'pending' THEN NULL ELSE now() END
			WHERE id = $1 AND attempts = $5 AND state = 'pending'`, j.id, outcome, e, nullTime(next), j.attempt)
		stale = err == nil && tag.RowsAffected() == 0
		return err
	})
	if err != nil {
		// The lease runs out and the delivery is tried again.
		log.Error().Err(err).Msg("record webhook attempt")
		return
	}
	if stale {
		d.attempts.WithLabelValues("stale").Inc()
		log.Warn().Str("outcome", outcome).Msg("webhook attempt outlived its lease: another attempt holds the delivery, its state is left to it")
		return
	}
	switch outcome {
	case StateDelivered:
		d.attempts.WithLabelValues("delivered").Inc()
		log.Info().Int("status_code", code).Dur("took", took).Msg("webhook delivered")
	case StatePending:
		d.attempts.WithLabelValues("retry").Inc()
		log.Warn().Int("status_code", code).Str("error_class", class).Str("error", detail).Time("next_attempt_at", next).Msg("webhook attempt failed")
	default:
		d.attempts.WithLabelValues("failed").Inc()
		log.Error().Int("status_code", code).Str("error_class", class).Str("error", detail).Msg("webhook delivery failed for good")
	}
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// send makes one attempt and returns the response status (0 when none).
func (d *Deliverer) send(ctx context.Context, j job, at time.Time) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.url, bytes.NewReader(j.body))
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "autoprov-deployer-webhooks/1")
	req.Header.Set(hmacsig.HeaderID, j.id)
	req.Header.Set(hmacsig.HeaderAttempt, strconv.Itoa(j.attempt))
	req.Header.Set(hmacsig.HeaderEvent, j.event)
	if j.keyID != "" {
		req.Header.Set(hmacsig.HeaderSignature, hmacsig.Sign(DeriveSecret(d.cfg.SigningKey, j.keyID), at, j.body))
	}
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		// The URL may hold a token of the receiver's (in its path or query):
		// keep it out of the stored error.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// backoff returns the delay after the attempt-th failed attempt: BackoffMin
// doubled each time, with jitter, at most BackoffMax.
func (d *Deliverer) backoff(attempt int) time.Duration {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = d.cfg.BackoffMin
	b.MaxInterval = d.cfg.BackoffMax
	b.Multiplier = 2
	b.RandomizationFactor = 0.2
	var delay time.Duration
	for range max(attempt, 1) {
		delay = b.NextBackOff()
	}
	return delay
}
