package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/jackc/pgx/v5"
)

// Notification is a server's notifiable state change.
type Notification struct {
	ID     int64
	Handle string
	Status string
	// Error is the server's last error at the change ("" for READY).
	Error string
	JobID string
	// Attempts is the server's failed attempts at the change.
	Attempts  int
	CreatedAt time.Time
}

// notifiable reports whether srv's status is one operators are told about:
// READY, UNREACHABLE, and FAILED once no retry is left.
func notifiable(srv *Server) bool {
	switch srv.Status {
	case StatusReady, StatusUnreachable:
		return true
	case StatusFailed:
		return srv.RetriesExhausted
	}
	return false
}

// maybeNotify writes a notification for srv's new status when it is
// notifiable and differs from the status notified last, and records it as
// notified. It runs in the transaction of the change.
func (s *Store) maybeNotify(ctx context.Context, tx pgx.Tx, srv *Server) error {
	if !notifiable(srv) || srv.NotifiedStatus == srv.Status {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO notifications (handle, status, error, job_id, attempts, created_at)
		VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, ''), $5, $6)`,
		srv.Handle, srv.Status, srv.LastError, srv.LastJobID, srv.Attempts, s.now())
	if err != nil {
		return fmt.Errorf("queue notification of server %s: %w", srv.Handle, err)
	}
	srv.NotifiedStatus = srv.Status
	return nil
}

// EnsureChannel registers a notification channel (e.g. "slack",
// "telegram:<chat>") the first time it is seen: it receives the
// notifications created from then on, not the backlog of before.
func (s *Store) EnsureChannel(ctx context.Context, channel string) error {
	if channel == "" {
		return fmt.Errorf("%w: empty channel", ErrInvalid)
	}
	_, err := s.db.Exec(ctx, `INSERT INTO notify_channels (channel, since_id)
		SELECT $1, COALESCE(max(id), 0) FROM notifications ON CONFLICT (channel) DO NOTHING`, channel)
	if err != nil {
		return fmt.Errorf("register channel %s: %w", channel, err)
	}
	return nil
}

// SendFunc delivers notifications (as one message or several) and returns
// nil only once all of them were accepted by the channel.
type SendFunc func(ctx context.Context, batch []Notification) error

// Deliver sends up to limit undelivered notifications of channel, oldest
// first, through send, and records them delivered in the same transaction
// as it read them. One replica delivers a channel at a time (a transaction
// advisory lock); Deliver returns 0 at once when another holds it. When
// send fails nothing is recorded and the same notifications come again.
// A crash while send runs sends them again after the restart: the only
// window for a repeat is one HTTP round trip.
func (s *Store) Deliver(ctx context.Context, channel string, limit int, send SendFunc) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit %d", ErrInvalid, limit)
	}
	n := 0
	err := txWithEffect(ctx, s.db, func(tx pgx.Tx, effectDone func() context.Context) error {
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, channelLockKey(channel)).Scan(&got); err != nil {
			return fmt.Errorf("lock channel %s: %w", channel, err)
		}
		if !got {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT n.id, n.handle, n.status, COALESCE(n.error, ''), COALESCE(n.job_id, ''),
				n.attempts, n.created_at
			FROM notifications n JOIN notify_channels c ON c.channel = $1 AND n.id > c.since_id
			WHERE NOT EXISTS (SELECT 1 FROM notification_deliveries d WHERE d.channel = $1 AND d.notification_id = n.id)
			ORDER BY n.id LIMIT $2`, channel, limit)
		if err != nil {
			return fmt.Errorf("pending notifications of %s: %w", channel, err)
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Notification, error) {
			var x Notification
			err := r.Scan(&x.ID, &x.Handle, &x.Status, &x.Error, &x.JobID, &x.Attempts, &x.CreatedAt)
			return x, err
		})
		if err != nil {
			return fmt.Errorf("pending notifications of %s: %w", channel, err)
		}
		if len(batch) == 0 {
			return nil
		}
		if err := send(ctx, batch); err != nil {
			return err
		}
		ctx := effectDone()
		ids := make([]int64, len(batch))
		for i, x := range batch {
			ids[i] = x.ID
		}
		if _, err := tx.Exec(ctx, `INSERT INTO notification_deliveries (notification_id, channel, delivered_at, message_count)
			SELECT id, $2, $3, $4 FROM unnest($1::bigint[]) AS id ON CONFLICT DO NOTHING`,
			ids, channel, s.now(), len(batch)); err != nil {
			return fmt.Errorf("record deliveries of %s: %w", channel, err)
		}
		n = len(batch)
		return nil
	})
	return n, err
}

// PendingNotifications returns how many notifications channel has not
// delivered yet.
func (s *Store) PendingNotifications(ctx context.Context, channel string) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM notifications n JOIN notify_channels c ON c.channel = $1 AND n.id > c.since_id
		WHERE NOT EXISTS (SELECT 1 FROM notification_deliveries d WHERE d.channel = $1 AND d.notification_id = n.id)`, channel).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pending notifications of %s: %w", channel, err)
	}
	return n, nil
}

func channelLockKey(channel string) int64 { return store.AdvisoryKey("notify:" + channel) }
