package cli

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestStatusFleetCounts checks the servers by status status shows, read
// through pkg/fleet: every server counted once under its status, statuses
// with no server left out, and only running runs in flight, oldest first.
func TestStatusFleetCounts(t *testing.T) {
	t.Parallel()
	url, _ := redisDB(t)
	dsn := testenv.EmptyDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO servers (handle, address, status, paused) VALUES
		('a-1', '192.0.2.1', 'READY', false), ('a-2', '192.0.2.2', 'READY', true), ('a-3', '192.0.2.3', 'READY', false),
		('b-1', '192.0.2.4', 'FAILED', false), ('c-1', '192.0.2.5', 'UNREACHABLE', false),
		('d-1', '192.0.2.6', 'NEW', false), ('d-2', '192.0.2.7', 'NEW', false), ('e-1', '192.0.2.8', 'ORPHANED', false);
		INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, owner, started_at)
		VALUES ('job-new', 'provision', 'provisioner:queue', '2-0', 'd-1', 'd-1', 'infra-b', now() - interval '10 seconds'),
		       ('job-old', 'provision', 'provisioner:queue', '1-0', 'd-2', 'd-2', 'infra-a', now() - interval '60 seconds');
		INSERT INTO runs (job_id, kind, stream, request_id, target, server_handle, owner, state, status, finished_at)
		VALUES ('job-done', 'provision', 'provisioner:queue', '0-1', 'a-1', 'a-1', 'infra-a', 'done', 'succeeded', now())`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_URL": url, "DATABASE_URL": dsn}
	out, errOut, code := run(t, env, "--json", "status")
	if code != 0 {
		t.Fatalf("status --json: exit %d: %s", code, errOut)
	}
	var fs fleetStatus
	mustJSON(t, out, &fs)
	want := map[string]int64{"READY": 3, "FAILED": 1, "UNREACHABLE": 1, "NEW": 2, "ORPHANED": 1}
	if !maps.Equal(fs.Servers, want) {
		t.Errorf("servers by status %v, want %v", fs.Servers, want)
	}
	if len(fs.Runs) != 2 || fs.Runs[0].JobID != "job-old" || fs.Runs[1].JobID != "job-new" ||
		fs.Runs[0].Target != "d-2" || fs.Runs[0].Kind != "provision" || fs.Runs[0].RunningSec < 50 {
		t.Errorf("runs in flight %+v, want job-old then job-new", fs.Runs)
	}

	out, _, code = run(t, env, "status")
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	_, fleetTable, _ := strings.Cut(out, "SERVER STATUS")
	for _, line := range []string{"READY", "NEW", "FAILED", "UNREACHABLE", "ORPHANED"} {
		if !strings.Contains(fleetTable, line) {
			t.Errorf("status table lacks %s:\n%s", line, fleetTable)
		}
	}
	for _, absent := range []string{"QUEUED", "PROVISIONING", "job-done"} {
		if strings.Contains(fleetTable, absent) {
			t.Errorf("status table shows %s:\n%s", absent, fleetTable)
		}
	}
}
