package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Channel is the Postgres notification channel Materialize notifies when
// it wrote occurrences: the deployer's launchers listen on it.
const Channel = "schedule_occurrences"

// perSchedule bounds the occurrences one schedule gets in one call (a
// schedule of @every 1s that is a minute behind catches up in steps).
const perSchedule = 100

// Beginner begins transactions (a *pgxpool.Pool).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Materialize writes the occurrences of the schedules due at now and
// moves each schedule's next_at on, in batches of batch schedules, one
// transaction each; it returns the occurrences written. An occurrence up
// to Grace late is on time; a later one is missed: dropped (Skip), or one
// for all of them (RunOnce). Replicas may call it at once: a schedule is
// taken by one of them (SKIP LOCKED), and an occurrence is a row keyed by
// (schedule, time), so a transaction cut short (kill -9) leaves nothing
// and the next call writes the same occurrences once.
func Materialize(ctx context.Context, db Beginner, now time.Time, batch int) (int, error) {
	if batch <= 0 {
		batch = 500
	}
	total := 0
	for {
		n, due, err := materializeBatch(ctx, db, now, batch)
		total += n
		if err != nil || due < batch {
			return total, err
		}
	}
}

type due struct {
	id, cron, rrule, tz, missed string
	dtstart                     *time.Time
	next                        time.Time
}

// Spec is d's when.
func (d due) spec() Spec {
	s := Spec{Cron: d.cron, RRule: d.rrule, Timezone: d.tz}
	if d.dtstart != nil {
		s.DTStart = *d.dtstart
	}
	return s
}

func materializeBatch(ctx context.Context, db Beginner, now time.Time, batch int) (written, taken int, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("schedules: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `SELECT id::text, cron, rrule, dtstart, timezone, missed, next_at FROM job_schedules
		WHERE NOT paused AND next_at <= $1 ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED`, now, batch)
	if err != nil {
		return 0, 0, fmt.Errorf("due schedules: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		return d, r.Scan(&d.id, &d.cron, &d.rrule, &d.dtstart, &d.tz, &d.missed, &d.next)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("due schedules: %w", err)
	}
	var occIDs, nextIDs, broken []string
	var occs []time.Time
	var nexts []*time.Time // nil: the rule is done
	for _, d := range list {
		s, err := Parse(d.spec())
		if err != nil {
			broken = append(broken, d.id) // checked when saved: a time zone gone from tzdata
			continue
		}
		at := d.next
		switch {
		case now.Sub(at) <= Grace:
			for i := 0; i < perSchedule && !at.IsZero() && !at.After(now) && now.Sub(at) <= Grace; i++ {
				occIDs, occs = append(occIDs, d.id), append(occs, at)
				at = s.Next(at)
			}
		case Missed(d.missed) == RunOnce:
			occIDs, occs = append(occIDs, d.id), append(occs, at)
			at = s.Next(now)
		default:
			at = s.Next(now)
		}
		var next *time.Time
		if !at.IsZero() {
			next = &at
		}
		nextIDs, nexts = append(nextIDs, d.id), append(nexts, next)
	}
	if len(occIDs) > 0 {
		tag, err := tx.Exec(ctx, `INSERT INTO schedule_occurrences (schedule_id, occurrence)
			SELECT * FROM unnest($1::uuid[], $2::timestamptz[]) ON CONFLICT DO NOTHING`, occIDs, occs)
		if err != nil {
			return 0, 0, fmt.Errorf("write occurrences: %w", err)
		}
		written = int(tag.RowsAffected())
	}
	if len(nextIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE job_schedules s SET next_at = u.next
			FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, next) WHERE s.id = u.id`, nextIDs, nexts); err != nil {
			return 0, 0, fmt.Errorf("move schedules on: %w", err)
		}
	}
	if len(broken) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE job_schedules SET paused = true WHERE id = ANY($1::uuid[])`, broken); err != nil {
			return 0, 0, fmt.Errorf("pause broken schedules: %w", err)
		}
	}
	if written > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			return 0, 0, fmt.Errorf("notify: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("schedules: %w", err)
	}
	return written, len(list), nil
}
