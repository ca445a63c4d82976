package store_test

import (
	"context"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestTransitionServerLeavesHistory: every status change TransitionServer
// writes (infra's) has its server_history row, written by the same
// statement; a write that keeps the status adds none.
func TestTransitionServerLeavesHistory(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "web-1", "192.0.2.10")
	to := func(status string, lastErr *string, jobID string) {
		t.Helper()
		if _, _, err := store.TransitionServer(ctx, pool, "web-1", jobID, func(*store.Server) (string, *string, bool) {
			return status, lastErr, true
		}); err != nil {
			t.Fatal(err)
		}
	}
	boom := "setup_server.yml: failed"
	to(store.ServerProvisioning, nil, "job-1")
	to(store.ServerFailed, &boom, "job-1")
	to(store.ServerFailed, &boom, "job-2") // status kept: no row

	rows, err := pool.Query(ctx, `SELECT event, COALESCE(from_status, ''), to_status, reason, COALESCE(job_id, ''), actor
		FROM server_history WHERE handle = 'web-1' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got [][6]string
	for rows.Next() {
		var r [6]string
		if err := rows.Scan(&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := [][6]string{
		{"transition", store.ServerNew, store.ServerProvisioning, "set by infra", "job-1", store.HistoryActor},
		{"transition", store.ServerProvisioning, store.ServerFailed, "set by infra: " + boom, "job-1", store.HistoryActor},
	}
	if len(got) != len(want) {
		t.Fatalf("history rows %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("history row %d = %v, want %v", i, got[i], want[i])
		}
	}
}
