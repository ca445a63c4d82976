package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2/ec2test"
)

// TestKillDuringFirstListing: the scheduler is killed with SIGKILL in the
// middle of a first listing of 20,000 servers from a slow EC2 (a stand-in),
// after it has written thousands of them in its open transaction. Nothing
// of the listing stays (the transaction dies with the connection), and the
// next scheduler registers every server exactly once: one row and one
// `detected` history row each. KILL_LISTING_SERVERS sets another fleet
// size (issue 35 runs it at 1,000,000; docs/performance.md).
func TestKillDuringFirstListing(t *testing.T) {
	t.Parallel()
	n := 20_000
	if v := os.Getenv("KILL_LISTING_SERVERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 20_000 {
			t.Fatalf("KILL_LISTING_SERVERS=%q: want a number of at least 20000", v)
		}
	}
	// Pages of 500 at 20,000 servers (40 pages, about 4 s of listing),
	// of 1,000 (EC2's most) above; the kill comes after 5/8 of them.
	pageSize := min(1000, max(500, n/1000))
	pages := (n + pageSize - 1) / pageSize
	// Time to list and write them: a minute, and about 250 s a million
	// (EC2 pages, then Postgres).
	long := time.Minute + time.Duration(n/4)*time.Millisecond
	ctx := context.Background()
	api := ec2test.New("eu-west-1", "AKIDTEST", "secret")
	t.Cleanup(api.Close)
	for i := range n {
		api.Add(ec2test.Instance{ID: fmt.Sprintf("i-%017x", i), PublicIP: fmt.Sprintf("10.%d.%d.%d", 1+i>>16, (i>>8)&255, i&255)})
	}
	api.SetDelay(max(10*time.Millisecond, 4*time.Second/time.Duration(pages)))
	w := newWorld(t, schedulerBinary(t), "EC2_REGION=eu-west-1", "EC2_ENDPOINT="+api.URL(), "EC2_ACCESS_KEY_ID=AKIDTEST",
		"EC2_SECRET_ACCESS_KEY_REF=env:AUTOPROV_SECRET_EC2", "AUTOPROV_SECRET_EC2=secret", "EC2_PAGE_SIZE="+strconv.Itoa(pageSize),
		"TICK_INTERVAL=1h", "SOURCE_TIMEOUT="+(2*long).String())
	p := w.start()
	// 5/8 of the pages read (at 20,000: 12,500 servers merged, two
	// batches of 5,000 written in the listing's transaction, which holds a
	// transaction id).
	testenv.WaitFor(t, long, "5/8 of the pages read", func() bool { return len(api.Requests()) >= pages*5/8 })
	var writing int
	if err := w.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL`).Scan(&writing); err != nil {
		t.Fatal(err)
	}
	if writing == 0 {
		t.Fatal("no transaction of the scheduler has written anything in the middle of its listing")
	}
	p.Signal(syscall.SIGKILL)
	p.Wait(30 * time.Second)
	count := func(q string) int {
		t.Helper()
		var c int
		if err := w.db.QueryRow(ctx, q).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The dead connection's transaction is rolled back once Postgres sees
	// the socket close.
	testenv.WaitFor(t, 30*time.Second, "the killed scheduler's transaction gone", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL`) == 0
	})
	if c := count(`SELECT count(*) FROM servers`); c != 0 {
		t.Fatalf("%d servers left by a listing killed halfway, want 0", c)
	}
	if c := count(`SELECT count(*) FROM server_history`); c != 0 {
		t.Fatalf("%d history rows left by a listing killed halfway, want 0", c)
	}

	api.SetDelay(0)
	w.start()
	testenv.WaitFor(t, 2*long, "every server registered", func() bool {
		return count(`SELECT count(*) FROM servers WHERE source = 'ec2'`) == n
	})
	if c := count(`SELECT count(*) FROM server_history WHERE event = 'detected'`); c != n {
		t.Errorf("%d detected history rows, want %d", c, n)
	}
	if c := count(`SELECT count(*) FROM (SELECT handle FROM server_history WHERE event = 'detected'
		GROUP BY handle HAVING count(*) > 1) d`); c != 0 {
		t.Errorf("%d servers detected more than once", c)
	}
}
