package fleet

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// liveRows is what a snapshot holds of each server: its source, its
// fingerprint and whether it is orphaned, by handle.
func liveRows(s *Snapshot) map[string]string {
	out := map[string]string{}
	for i := range s.rows {
		r := s.rows[i]
		if r.dead {
			continue
		}
		h := s.handle(int32(i))
		if j, ok := s.index[s.key(h)]; !ok || int(j) != i {
			out[h] = "not indexed"
			continue
		}
		out[h] = fmt.Sprintf("%s %x %v %v", s.sources[r.src], r.fp, r.hasFP, r.orphaned)
	}
	return out
}

// A snapshot kept from tick to tick reads only what changed, and ends up
// holding what a snapshot read afresh holds after every kind of change:
// servers new, changed, orphaned, deleted and renamed, a transaction that
// was in flight at the last load and commits after a later one, and a
// truncated table.
func TestSnapshotFollowsChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	s := New(db, Options{})
	det := func(h, addr, gen string) Detected {
		return Detected{Handle: h, Address: addr, Labels: map[string]string{"gen": gen}}
	}
	list := func(src string, servers ...Detected) {
		t.Helper()
		if _, err := s.Sync(ctx, SyncRequest{Source: src, Servers: servers, Actor: "detector:" + src}); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	kept := NewSnapshot()
	// check loads kept and a fresh snapshot and compares them; it returns
	// how many rows the kept one read.
	check := func(step string) int {
		t.Helper()
		before := len(kept.rows)
		if err := s.LoadSnapshot(ctx, kept); err != nil {
			t.Fatal(err)
		}
		fresh := NewSnapshot()
		if err := s.LoadSnapshot(ctx, fresh); err != nil {
			t.Fatal(err)
		}
		if got, want := liveRows(kept), liveRows(fresh); !maps.Equal(got, want) {
			t.Fatalf("%s: the kept snapshot holds\n%v\nwant (read afresh)\n%v", step, got, want)
		}
		return len(kept.rows) - before
	}
	list("inv", det("a-1", "192.0.2.1", "1"), det("a-2", "192.0.2.2", "1"), det("a-3", "192.0.2.3", "1"))
	list("ec2", det("b-1", "192.0.2.11", "1"))
	check("first load")
	fullAt := kept.fullAt

	// Only a status changed: nothing logged, nothing to read (and the
	// update can be HOT: no index of servers tracks changes).
	changes := func(h string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM server_changes WHERE handle = $1`, h).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	logged := changes("a-1")
	exec(`UPDATE servers SET status = 'READY' WHERE handle = 'a-1'`)
	if got := changes("a-1"); got != logged {
		t.Errorf("a status change logged %d changes of a-1, want none", got-logged)
	}
	if n := check("a status change"); n != 0 {
		t.Errorf("the kept snapshot appended %d rows, want none", n)
	}

	// Changed, new, orphaned (a-3 no longer listed), taken over.
	list("inv", det("a-1", "192.0.2.1", "2"), det("a-2", "192.0.2.2", "1"), det("a-4", "192.0.2.4", "1"), det("b-1", "192.0.2.11", "1"))
	if n := check("changed, new, orphaned, taken over"); n != 1 {
		t.Errorf("the kept snapshot appended %d rows, want 1 (a-4)", n)
	}
	if kept.fullAt != fullAt {
		t.Fatal("the kept snapshot read every row again")
	}
	if got := changes("a-2"); got != 1 {
		t.Errorf("a-2, listed unchanged, has %d logged changes, want 1 (its creation)", got)
	}
	if got := changes("a-1"); got != logged+1 {
		t.Errorf("a-1, changed at its source, has %d logged changes, want %d", got, logged+1)
	}

	// Deleted, renamed, and deleted then created again.
	exec(`DELETE FROM servers WHERE handle = 'a-2'`)
	exec(`UPDATE servers SET handle = 'a-5' WHERE handle = 'a-4'`)
	exec(`DELETE FROM servers WHERE handle = 'b-1'`)
	list("ec2", det("b-1", "192.0.2.11", "3"))
	check("deleted, renamed, deleted and created again")

	// A transaction in flight at a load, which commits after one that
	// began later committed and was read: the next load reads it.
	early, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(context.Background())
	if _, err := early.Exec(ctx, `UPDATE servers SET source_hash = 'early' WHERE handle = 'a-1'`); err != nil {
		t.Fatal(err)
	}
	list("inv", det("a-1", "192.0.2.1", "2"), det("a-5", "192.0.2.4", "1"), det("a-6", "192.0.2.6", "1"))
	check("a transaction in flight")
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	check("the transaction in flight committed")

	// Truncated: read afresh.
	exec(`TRUNCATE servers CASCADE`)
	list("inv", det("c-1", "192.0.2.21", "1"))
	check("truncated")
	if kept.fullAt == fullAt {
		t.Error("after a truncation the kept snapshot did not read every row again")
	}
	var truncations int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM server_changes WHERE handle IS NULL`).Scan(&truncations); err != nil {
		t.Fatal(err)
	}
	if truncations != 1 {
		t.Errorf("the change log holds %d truncations, want 1", truncations)
	}
}

// A listing in the snapshot's order finds its rows without hashing
// handles; out of order, or with handles the snapshot lacks, it finds the
// same rows.
func TestPreparerFindsRows(t *testing.T) {
	snap := NewSnapshot()
	for i := range 5 {
		h := fmt.Sprintf("h-%d", i)
		snap.text = append(snap.text, h...)
		snap.ends = append(snap.ends, uint32(len(snap.text)))
		snap.index[snap.key(h)] = int32(i)
		snap.rows = append(snap.rows, snapRow{})
	}
	snap.rows[3].dead = true
	delete(snap.index, snap.key("h-3"))
	pr := snap.Preparer("")
	for _, tc := range []struct {
		handle string
		row    int32
	}{
		{"h-0", 0}, {"h-1", 1}, {"h-2", 2}, {"h-3", -1}, {"h-4", 4},
		{"h-1", 1}, {"new", -1}, {"h-2", 2}, {"h-4", 4}, {"h-0", 0},
	} {
		p, err := pr.Prepare(Detected{Handle: tc.handle, Address: "192.0.2.1"})
		if err != nil {
			t.Fatal(err)
		}
		if p.row != tc.row {
			t.Errorf("%s: row %d, want %d", tc.handle, p.row, tc.row)
		}
		if p.row < 0 && p.key != snap.key(tc.handle) {
			t.Errorf("%s: not in the snapshot, and without its key (for claims)", tc.handle)
		}
	}
}

// A listing in another order than the snapshot's rows (the table's order
// after a first load, or a source that reordered) reorders the rows at the
// next load, once: the listing after finds every row at the row after the
// one before.
func TestSnapshotTakesTheListingsOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := New(testenv.Pool(t), Options{})
	var servers []Detected
	for i := range 40 {
		servers = append(servers, Detected{Handle: fmt.Sprintf("s-%02d", i), Address: fmt.Sprintf("192.0.2.%d", i+1)})
	}
	if _, err := s.Sync(ctx, SyncRequest{Source: "inv", Servers: servers, Actor: "detector:inv"}); err != nil {
		t.Fatal(err)
	}
	snap := NewSnapshot()
	// list prepares and claims the servers from the last to the first and
	// returns how many were found out of order.
	list := func() (misses int) {
		t.Helper()
		if err := s.LoadSnapshot(ctx, snap); err != nil {
			t.Fatal(err)
		}
		pr := snap.Preparer("")
		for i := len(servers) - 1; i >= 0; i-- {
			p, err := pr.Prepare(servers[i])
			if err != nil || p.row < 0 {
				t.Fatalf("%s: row %d, %v", servers[i].Handle, p.row, err)
			}
			if !p.next {
				misses++
			}
			snap.Claim(&p, 0)
		}
		return misses
	}
	if m := list(); m < len(servers)/2 {
		t.Fatalf("%d of %d found out of order in a reversed listing, want most", m, len(servers))
	}
	if m := list(); m > 1 {
		t.Errorf("after the reorder, %d of %d found out of order, want at most the first", m, len(servers))
	}
	fresh := NewSnapshot()
	if err := s.LoadSnapshot(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if got, want := liveRows(snap), liveRows(fresh); !maps.Equal(got, want) {
		t.Fatalf("the reordered snapshot holds\n%v\nwant\n%v", got, want)
	}
}

// A first listing logs the handles of its first inserts only, then one
// NULL handle a statement (migration 00072), so that a kept snapshot reads
// every row at its next load and ends up as one read afresh; the next,
// small, sync logs its handles again. (Whether a later load reads every
// row again depends on the cluster's horizon, which other tests hold.)
func TestFirstListingSummarizesItsInserts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testenv.Pool(t)
	s := New(db, Options{})
	kept := NewSnapshot()
	if err := s.LoadSnapshot(ctx, kept); err != nil {
		t.Fatal(err)
	}
	fullAt := kept.fullAt
	const n = snapManyChanges + 3*syncBatch
	servers := make([]Detected, n)
	for i := range servers {
		servers[i] = Detected{Handle: fmt.Sprintf("f-%06d", i), Address: fmt.Sprintf("10.1.%d.%d", i>>8, i&255)}
	}
	st, err := s.Sync(ctx, SyncRequest{Source: "inv", Servers: servers, Actor: "detector:inv"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Detected != n {
		t.Fatalf("detected %d servers, want %d", st.Detected, n)
	}
	counts := func() (handles, nulls int) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT count(handle), count(*) - count(handle) FROM server_changes`).Scan(&handles, &nulls); err != nil {
			t.Fatal(err)
		}
		return handles, nulls
	}
	handles, nulls := counts()
	// Batches are logged by handle until they pass snapManyChanges.
	if want := (snapManyChanges/syncBatch + 1) * syncBatch; handles != want || nulls == 0 {
		t.Errorf("the change log holds %d handles and %d NULLs, want %d handles and some NULLs", handles, nulls, want)
	}
	var servers0 int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM servers`).Scan(&servers0); err != nil {
		t.Fatal(err)
	}
	if servers0 != n {
		t.Fatalf("servers holds %d rows, want %d", servers0, n)
	}
	time.Sleep(time.Millisecond) // fullAt must move
	if err := s.LoadSnapshot(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if kept.fullAt == fullAt {
		t.Error("after a first listing the kept snapshot did not read every row again")
	}
	fresh := NewSnapshot()
	if err := s.LoadSnapshot(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if got, want := liveRows(kept), liveRows(fresh); len(got) != n || !maps.Equal(got, want) {
		t.Fatalf("the kept snapshot holds %d servers, not what a fresh one holds (%d)", len(got), len(want))
	}
	// A small sync after it: its inserts are logged by handle again.
	if _, err := s.Sync(ctx, SyncRequest{Source: "inv", Servers: append(servers, Detected{Handle: "g-1", Address: "192.0.2.1"}),
		Actor: "detector:inv"}); err != nil {
		t.Fatal(err)
	}
	if h, nn := counts(); h != handles+1 || nn != nulls {
		t.Errorf("after a small sync the change log holds %d handles and %d NULLs, want %d and %d", h, nn, handles+1, nulls)
	}
}
