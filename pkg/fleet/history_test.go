package fleet_test

import (
	"fmt"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// A server's history follows it when an operator renames or deletes it by
// hand, and goes with the table when it is truncated: what the foreign key
// of server_history did before triggers took its place (migration 00069).
func TestHistoryFollowsRenamesAndDeletes(t *testing.T) {
	s, b := setup(t)
	ctx := ctxT(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := b.db.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	count := func(handle string) int {
		t.Helper()
		var n int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM server_history WHERE handle = $1`, handle).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	list := func(handles ...string) {
		t.Helper()
		var servers []fleet.Detected
		for i, h := range handles {
			servers = append(servers, fleet.Detected{Handle: h, Address: fmt.Sprintf("192.0.2.%d", i+1)})
		}
		if _, err := s.Sync(ctx, fleet.SyncRequest{Source: "static:hist", Servers: servers, Actor: "detector:static:hist"}); err != nil {
			t.Fatal(err)
		}
	}
	list("h-1", "h-2", "h-3")
	for _, h := range []string{"h-1", "h-2", "h-3"} {
		if got := events(t, s, h); len(got) != 1 || got[0] != "detected ->NEW by detector:static:hist" {
			t.Fatalf("history of %s after the listing: %v", h, got)
		}
	}

	exec(`UPDATE servers SET handle = 'h-1b' WHERE handle = 'h-1'`)
	if got := events(t, s, "h-1b"); len(got) != 1 || got[0] != "detected ->NEW by detector:static:hist" {
		t.Fatalf("history of the renamed server: %v", got)
	}
	if n := count("h-1"); n != 0 {
		t.Fatalf("%d history rows left under the old handle", n)
	}

	exec(`DELETE FROM servers WHERE handle = 'h-2'`)
	if n := count("h-2"); n != 0 {
		t.Fatalf("%d history rows of a deleted server", n)
	}
	if n := count("h-3"); n != 1 {
		t.Fatalf("the delete of h-2 took %d of h-3's one history row", 1-n)
	}
	// A server of the same handle listed again starts a history of its own.
	list("h-1b", "h-2", "h-3")
	if got := events(t, s, "h-2"); len(got) != 1 || got[0] != "detected ->NEW by detector:static:hist" {
		t.Fatalf("history of h-2 listed again: %v", got)
	}

	exec(`TRUNCATE servers CASCADE`)
	var left int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM server_history`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d history rows outlived a truncation of servers", left)
	}
}
