package schedules

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestLoopWritesOnlyWhileLeading: a replica that does not lead writes no
// occurrence; once it leads, the due schedule's occurrence is written by
// the next round.
func TestLoopWritesOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tpl, id := uuid.NewString(), uuid.NewString()
	const project = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	if _, err := db.Exec(ctx, `INSERT INTO job_templates (id, project_id, name, version) VALUES ($1, $2, 'site', 1)`, tpl, project); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO job_schedules (id, project_id, template_id, name, cron, next_at)
		VALUES ($1, $2, $3, 'hourly', '@hourly', now() - interval '1 second')`, id, project, tpl); err != nil {
		t.Fatal(err)
	}
	var leading atomic.Bool
	l, err := New(db, Config{Interval: 20 * time.Millisecond, Active: leading.Load, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	count := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM schedule_occurrences WHERE schedule_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(200 * time.Millisecond)
	if n := count(); n != 0 {
		t.Fatalf("%d occurrences written while not leading", n)
	}
	leading.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for count() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(); n != 1 {
		t.Errorf("%d occurrences once leading, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}
