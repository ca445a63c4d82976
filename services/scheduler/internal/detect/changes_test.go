package detect_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
)

// versionedSource tells what changed (detect.ChangeDetector): server i
// has the version vers[i] and the address addrs[i]; built counts the
// servers it had to build in its last listing.
type versionedSource struct {
	name   string
	prefix string // of the handles, "v" when empty
	vers   []uint64
	addrs  []string
	built  int
	listed int
}

func (s *versionedSource) Name() string { return s.name }

func (s *versionedSource) handle(i int) string {
	if s.prefix == "" {
		return fmt.Sprintf("v-%03d", i)
	}
	return fmt.Sprintf("%s-%03d", s.prefix, i)
}

func (s *versionedSource) server(i int) fleet.Detected {
	return fleet.Detected{Handle: s.handle(i), Address: s.addrs[i],
		Labels: map[string]string{"gen": fmt.Sprint(s.vers[i])}}
}

func (s *versionedSource) Detect(_ context.Context, yield func(fleet.Detected) error) error {
	for i := range s.vers {
		if err := yield(s.server(i)); err != nil {
			return err
		}
	}
	return nil
}

func (s *versionedSource) DetectChanges(_ context.Context, known func(string, uint64) bool, yield func(fleet.Detected, uint64) error) error {
	s.built, s.listed = 0, 0
	for i, v := range s.vers {
		s.listed++
		if known(s.handle(i), v) {
			continue
		}
		s.built++
		if err := yield(s.server(i), v); err != nil {
			return err
		}
	}
	return nil
}

// TestChangeDetectorBuildsOnlyWhatChanged: a source that tells what
// changed builds, from its third listing on (the first creates the
// servers, the second finds them unchanged and remembers their versions),
// only the servers whose version changed, or that something else changed
// in the fleet since; the servers it skips are still its own (not
// orphaned), still hold their addresses against other servers, and are
// counted unchanged; and a tick's result is what a full listing gives.
func TestChangeDetectorBuildsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := fleet.New(testenv.Pool(t), fleet.Options{})
	// A transaction open throughout (here, or another test's anywhere in
	// the cluster) holds the horizon back: every load reads every change
	// since again, and must find the rows as they were.
	held, err := f.DB().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Rollback(ctx) }()
	if _, err := held.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	const n = 50
	src := &versionedSource{name: "versioned", vers: make([]uint64, n), addrs: make([]string, n)}
	for i := range n {
		src.vers[i], src.addrs[i] = 1, fmt.Sprintf("10.9.0.%d", i+1)
	}
	// A source of higher precedence, empty until later.
	other := &versionedSource{name: "first", prefix: "w"}
	mgr, err := detect.NewManager(f, []detect.Detector{other, src}, detect.Options{Guard: testGuard(t, nil, "127.0.0.1/8")})
	if err != nil {
		t.Fatal(err)
	}
	tick := func(step string) detect.SourceReport {
		t.Helper()
		rep, err := mgr.Sync(ctx)
		if err != nil || rep.Err() != nil {
			t.Fatalf("%s: %v %v", step, err, rep.Err())
		}
		return rep.Sources[1]
	}
	if r := tick("first listing"); r.Stats.Detected != n || src.built != n {
		t.Fatalf("first listing: %d created, %d built, want %d", r.Stats.Detected, src.built, n)
	}
	if r := tick("second listing"); r.Stats.Unchanged != n || src.built != n {
		t.Fatalf("second listing: %d unchanged, %d built, want %d (versions not known yet)", r.Stats.Unchanged, src.built, n)
	}
	if r := tick("third listing"); r.Stats.Unchanged != n || src.built != 0 || src.listed != n {
		t.Fatalf("third listing: %d unchanged, %d of %d built, want every server unchanged and none built", r.Stats.Unchanged, src.built, src.listed)
	}

	// Two servers change at the source, one is changed by an operator in
	// the fleet (its fingerprint), and one has its status changed only.
	src.vers[3], src.vers[7] = 2, 2
	exec := func(q string) {
		t.Helper()
		if _, err := f.DB().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE servers SET source_hash = 'edited' WHERE handle = 'v-011'`)
	exec(`UPDATE servers SET status = 'READY' WHERE handle = 'v-012'`)
	r := tick("changes")
	if src.built != 3 || r.Stats.Updated != 3 || r.Stats.Unchanged != n-3 {
		t.Fatalf("changes: %d built, %d updated, %d unchanged; want 3, 3, %d", src.built, r.Stats.Updated, r.Stats.Unchanged, n-3)
	}
	if got := serverCount(t, f, `SELECT count(*) FROM servers WHERE labels->>'gen' = '2'`); got != 2 {
		t.Errorf("%d servers with the new labels, want 2", got)
	}
	// The updated servers are read again, found unchanged and known after.
	tick("after the changes")
	if r := tick("known again"); src.built != 0 || r.Stats.Unchanged != n {
		t.Fatalf("known again: %d built, %d unchanged, want 0 and %d", src.built, r.Stats.Unchanged, n)
	}

	// A server the source skips still holds its address: when a source
	// of higher precedence lists another server at it, the skipped server
	// is a duplicate, as it would be in a full listing (skipped, so no
	// longer listed: orphaned), although its source did not build it.
	other.vers, other.addrs = []uint64{1}, []string{src.addrs[9]}
	r = tick("an address taken by a source of higher precedence")
	if src.built != 0 || r.Duplicates != 1 || r.Stats.Orphaned != 1 {
		t.Fatalf("%d built, %d duplicates, %d orphaned; want 0, 1 (v-009 at w-000's address) and 1", src.built, r.Duplicates, r.Stats.Orphaned)
	}
	if got := serverCount(t, f, `SELECT count(*) FROM servers WHERE handle = 'v-009' AND status = 'ORPHANED'`); got != 1 {
		t.Error("v-009, listed at an address a source of higher precedence has, is not ORPHANED")
	}
	if got := serverCount(t, f, `SELECT count(*) FROM servers WHERE source = 'versioned' AND status <> 'ORPHANED'`); got != n-1 {
		t.Errorf("%d servers of the source not orphaned, want %d", got, n-1)
	}
	// Given its address back, it returns: an orphaned server is never
	// known, so its source builds it again.
	other.vers[0], other.addrs[0] = 2, "10.9.1.1"
	r = tick("the address free again")
	if src.built != 1 || r.Stats.Returned != 1 {
		t.Fatalf("%d built, %d returned; want 1 and 1 (v-009)", src.built, r.Stats.Returned)
	}
}
