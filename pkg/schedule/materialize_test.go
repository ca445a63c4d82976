package schedule_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

const project = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"

// newSchedule stores a template and a schedule of it with its first
// occurrence at next, and returns the schedule's id.
func newSchedule(t *testing.T, db *pgxpool.Pool, name, cron, missed string, next time.Time) string {
	t.Helper()
	ctx := context.Background()
	tpl, id := uuid.NewString(), uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO job_templates (id, project_id, name, version) VALUES ($1, $2, $3, 1)`, tpl, project, name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO job_schedules (id, project_id, template_id, name, cron, missed, next_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, project, tpl, name, cron, missed, next); err != nil {
		t.Fatal(err)
	}
	return id
}

func occurrences(t *testing.T, db *pgxpool.Pool, id string) []time.Time {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT occurrence FROM schedule_occurrences WHERE schedule_id = $1 ORDER BY occurrence`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMaterializeExactlyOnce: a schedule of @every 1s run through 200
// occurrences by two leaders at once (a leader change mid-flight), with a
// third whose connection is killed inside its transaction every few
// occurrences (what kill -9 of a scheduler leaves Postgres), has each of
// its 200 occurrences exactly once, none missing, and moves on to the
// 201st.
func TestMaterializeExactlyOnce(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	id := newSchedule(t, db, "every-second", "@every 1s", "skip", t0)
	killed := 0
	for i := range 200 {
		now := t0.Add(time.Duration(i) * time.Second)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := schedule.Materialize(ctx, db, now, 10); err != nil {
					t.Errorf("at %s: %v", now, err)
				}
			})
		}
		if i%7 == 0 {
			// A leader that took the schedule and dies before committing.
			conn, err := db.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			_, _ = tx.Exec(ctx, `INSERT INTO schedule_occurrences (schedule_id, occurrence)
				SELECT id, next_at FROM job_schedules WHERE id = $1 FOR UPDATE SKIP LOCKED ON CONFLICT DO NOTHING`, id)
			if _, err := db.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			conn.Release()
			killed++
		}
		wg.Wait()
	}
	got := occurrences(t, db, id)
	if len(got) != 200 {
		t.Fatalf("%d occurrences, want 200", len(got))
	}
	for i, at := range got {
		if want := t0.Add(time.Duration(i) * time.Second); !at.Equal(want) {
			t.Fatalf("occurrence %d at %s, want %s", i, at, want)
		}
	}
	var next time.Time
	if err := db.QueryRow(ctx, `SELECT next_at FROM job_schedules WHERE id = $1`, id).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(200 * time.Second); !next.Equal(want) {
		t.Errorf("next_at %s, want %s", next, want)
	}
	t.Logf("200 occurrences, %d leaders killed mid-transaction", killed)
}

// TestMaterializeMissed: occurrences more than Grace late are dropped
// (skip) or run once for all of them (run_once); on-time ones that piled
// up within Grace each run; a paused schedule runs none.
func TestMaterializeMissed(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 7, 10, 30, 0, 0, time.UTC)
	hourAgo := now.Add(-time.Hour)
	skip := newSchedule(t, db, "skip", "*/5 * * * *", "skip", hourAgo)
	once := newSchedule(t, db, "once", "*/5 * * * *", "run_once", hourAgo)
	catchUp := newSchedule(t, db, "catch-up", "@every 10s", "skip", now.Add(-40*time.Second))
	paused := newSchedule(t, db, "paused", "*/5 * * * *", "run_once", hourAgo)
	if _, err := db.Exec(ctx, `UPDATE job_schedules SET paused = true WHERE id = $1`, paused); err != nil {
		t.Fatal(err)
	}
	n, err := schedule.Materialize(ctx, db, now, 0)
	if err != nil || n != 6 {
		t.Fatalf("wrote %d occurrences (%v), want 6", n, err)
	}
	for _, tc := range []struct {
		name, id string
		want     []time.Time
		next     time.Time
	}{
		{"skip", skip, nil, now.Add(5 * time.Minute)},
		{"run_once", once, []time.Time{hourAgo}, now.Add(5 * time.Minute)},
		{"within grace", catchUp, []time.Time{now.Add(-40 * time.Second), now.Add(-30 * time.Second), now.Add(-20 * time.Second),
			now.Add(-10 * time.Second), now}, now.Add(10 * time.Second)},
		{"paused", paused, nil, hourAgo},
	} {
		got := occurrences(t, db, tc.id)
		var next time.Time
		if err := db.QueryRow(ctx, `SELECT next_at FROM job_schedules WHERE id = $1`, tc.id).Scan(&next); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) || !next.Equal(tc.next) {
			t.Errorf("%s: occurrences %v, next %s; want %v, next %s", tc.name, got, next, tc.want, tc.next)
			continue
		}
		for i := range got {
			if !got[i].Equal(tc.want[i]) {
				t.Errorf("%s: occurrences %v, want %v", tc.name, got, tc.want)
			}
		}
	}
	if n, err := schedule.Materialize(ctx, db, now, 0); err != nil || n != 0 {
		t.Errorf("a second call at the same time wrote %d (%v)", n, err)
	}
}

// TestMaterializeRRule: an RRULE schedule (its DTSTART stored) gets each
// of its occurrences once, on the wall clock of its zone, until its COUNT
// runs out: then its next_at is NULL and it gets no more. The table
// holds a cron or an RRULE, exactly one.
func TestMaterializeRRule(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	ctx := context.Background()
	// Tuesdays and Thursdays at 9:30 in Vilnius, four times, from Monday
	// 30 March 2026 (summer time: 6:30 UTC).
	dtstart := time.Date(2026, 3, 30, 0, 0, 0, 0, time.UTC)
	const rule = "FREQ=WEEKLY;BYDAY=TU,TH;BYHOUR=9;BYMINUTE=30;COUNT=4"
	spec := schedule.Spec{RRule: rule, Timezone: "Europe/Vilnius", DTStart: dtstart}
	s, err := schedule.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Next(dtstart)
	tpl, id := uuid.NewString(), uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO job_templates (id, project_id, name, version) VALUES ($1, $2, 'rrule', 1)`, tpl, project); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO job_schedules (id, project_id, template_id, name, cron, rrule, dtstart, timezone, next_at)
		VALUES ($1, $2, $3, 'rrule', '', $4, $5, $6, $7)`, id, project, tpl, rule, dtstart, spec.Timezone, first); err != nil {
		t.Fatal(err)
	}
	// The leader runs every minute for two weeks.
	for now := dtstart; now.Before(dtstart.AddDate(0, 0, 14)); now = now.Add(time.Minute) {
		if _, err := schedule.Materialize(ctx, db, now, 0); err != nil {
			t.Fatal(err)
		}
	}
	got := occurrences(t, db, id)
	want := []time.Time{
		time.Date(2026, 3, 31, 6, 30, 0, 0, time.UTC), time.Date(2026, 4, 2, 6, 30, 0, 0, time.UTC),
		time.Date(2026, 4, 7, 6, 30, 0, 0, time.UTC), time.Date(2026, 4, 9, 6, 30, 0, 0, time.UTC),
	}
	if len(got) != len(want) {
		t.Fatalf("occurrences %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Fatalf("occurrences %v, want %v", got, want)
		}
	}
	var next *time.Time
	if err := db.QueryRow(ctx, `SELECT next_at FROM job_schedules WHERE id = $1`, id).Scan(&next); err != nil || next != nil {
		t.Errorf("next_at %v (%v) after the COUNT ran out, want NULL", next, err)
	}
	for _, tc := range []struct{ name, cron, rule string }{{"both", "0 9 * * *", rule}, {"neither", "", ""}} {
		var dt *time.Time
		if tc.rule != "" {
			dt = &dtstart
		}
		if _, err := db.Exec(ctx, `INSERT INTO job_schedules (id, project_id, template_id, name, cron, rrule, dtstart, next_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, now())`, uuid.NewString(), project, tpl, tc.name, tc.cron, tc.rule, dt); err == nil {
			t.Errorf("a schedule with %s a cron and an RRULE stored", tc.name)
		}
	}
}
