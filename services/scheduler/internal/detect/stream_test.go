package detect_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect"
)

// pagedSource lists n servers a-00000..; it fails, or waits for its
// context, after failAfter of them when failAfter > 0. gen changes every
// server's labels.
type pagedSource struct {
	name      string
	prefix    string // of the handles, the name when empty
	n         int
	gen       int
	failAfter int
	block     bool
	listed    chan int // when not nil, told how many were listed before failing/blocking
}

func (s *pagedSource) Name() string { return s.name }

func (s *pagedSource) Detect(ctx context.Context, yield func(fleet.Detected) error) error {
	prefix := s.prefix
	if prefix == "" {
		prefix = s.name
	}
	for i := range s.n {
		if s.failAfter > 0 && i == s.failAfter {
			if s.listed != nil {
				s.listed <- i
			}
			if s.block {
				<-ctx.Done()
				return ctx.Err()
			}
			return errors.New("provider answered 503 on page 7")
		}
		err := yield(fleet.Detected{Handle: fmt.Sprintf("%s-%05d", prefix, i),
			Address: fmt.Sprintf("10.%d.%d.%d", 1+i>>16, (i>>8)&255, i&255),
			Labels:  map[string]string{"gen": fmt.Sprint(s.gen)}})
		if err != nil {
			return err
		}
	}
	return nil
}

func serverCount(t *testing.T, f *fleet.Store, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.DB().QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestListingFailingHalfwayChangesNothing: a source's servers are written
// while its listing streams in (pages of hundreds), so a listing that fails
// after thousands of servers, or a tick cancelled in the middle of one (the
// scheduler stopping, or killed: its transaction dies with its
// connection), must leave the fleet as it was: no server of the listing
// created or updated, none orphaned, no history row.
func TestListingFailingHalfwayChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := fleet.New(testenv.Pool(t), fleet.Options{})
	src := &pagedSource{name: "paged", n: 6000}
	mgr, err := detect.NewManager(f, []detect.Detector{src}, detect.Options{Guard: testGuard(t, nil, "127.0.0.1/8")})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := mgr.Sync(ctx)
	if err != nil || rep.Err() != nil {
		t.Fatalf("first listing: %v %v", err, rep.Err())
	}
	if st := rep.Sources[0].Stats; st.Detected != 6000 || st.Listed != 6000 {
		t.Fatalf("first listing: %+v", st)
	}
	historyBefore := serverCount(t, f, `SELECT count(*) FROM server_history`)

	// Every server changes, and the listing fails after 4,000 of them
	// (eight pages written in the transaction): nothing changes.
	src.gen, src.failAfter = 1, 4000
	rep, err = mgr.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sources[0].Err == nil {
		t.Fatal("a listing that failed halfway reported no error")
	}
	if n := serverCount(t, f, `SELECT count(*) FROM servers WHERE labels->>'gen' <> '0' OR status = 'ORPHANED'`); n != 0 {
		t.Fatalf("%d servers changed by a failed listing", n)
	}
	if n := serverCount(t, f, `SELECT count(*) FROM server_history`); n != historyBefore {
		t.Fatalf("history grew from %d to %d rows on a failed listing", historyBefore, n)
	}

	// The tick is cancelled while the source is in the middle of its
	// listing: nothing changes either.
	src.failAfter, src.block, src.listed = 5000, true, make(chan int, 1)
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := mgr.Sync(tctx)
		done <- err
	}()
	<-src.listed
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled tick: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a cancelled tick did not return")
	}
	if n := serverCount(t, f, `SELECT count(*) FROM servers WHERE labels->>'gen' <> '0' OR status = 'ORPHANED'`); n != 0 {
		t.Fatalf("%d servers changed by a cancelled listing", n)
	}

	// The next listing applies all of it; then a shorter one orphans the
	// rest, within the guard.
	src.failAfter, src.block, src.listed = 0, false, nil
	rep, err = mgr.Sync(ctx)
	if err != nil || rep.Err() != nil {
		t.Fatalf("listing: %v %v", err, rep.Err())
	}
	if st := rep.Sources[0].Stats; st.Updated != 6000 || st.Unchanged != 0 {
		t.Fatalf("after the failed listings: %+v, want 6000 updated", st)
	}
	src.n = 5000
	rep, err = mgr.Sync(ctx)
	if err != nil || rep.Err() != nil {
		t.Fatalf("listing: %v %v", err, rep.Err())
	}
	if st := rep.Sources[0].Stats; st.Unchanged != 5000 || st.Orphaned != 1000 || st.Updated != 0 {
		t.Fatalf("shorter listing: %+v", st)
	}
	if n := serverCount(t, f, `SELECT count(*) FROM servers WHERE status = 'ORPHANED' AND handle >= 'paged-05000'`); n != 1000 {
		t.Fatalf("%d servers orphaned, want the last 1000", n)
	}
}

// TestStreamedPrecedence: two sources list overlapping servers, many pages
// each; the first wins every handle it lists, the second gets the rest.
// When the first no longer lists some of its servers that the second
// lists, they are not orphaned (the second may not take them over from a
// source of higher precedence: they stay as they are).
func TestStreamedPrecedence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := fleet.New(testenv.Pool(t), fleet.Options{})
	a := &pagedSource{name: "a", n: 3000}
	b := &pagedSource{name: "b", prefix: "a", n: 4000} // a-00000..a-03999
	mgr, err := detect.NewManager(f, []detect.Detector{a, b}, detect.Options{Guard: testGuard(t, nil, "127.0.0.1/8")})
	if err != nil {
		t.Fatal(err)
	}
	sync := func() detect.Report {
		t.Helper()
		rep, err := mgr.Sync(ctx)
		if err != nil || rep.Err() != nil {
			t.Fatalf("%v %v", err, rep.Err())
		}
		return rep
	}
	rep := sync()
	if rep.Sources[0].Stats.Detected != 3000 || rep.Sources[1].Duplicates != 3000 || rep.Sources[1].Stats.Detected != 1000 {
		t.Fatalf("a: %+v; b: %+v (duplicates %d)", rep.Sources[0].Stats, rep.Sources[1].Stats, rep.Sources[1].Duplicates)
	}
	if n := serverCount(t, f, `SELECT count(*) FROM servers WHERE source = 'b' AND handle >= 'a-03000'`); n != 1000 {
		t.Fatalf("b owns %d servers, want a-03000..a-03999", n)
	}
	a.n = 2500
	rep = sync()
	if st := rep.Sources[0].Stats; st.Orphaned != 0 || st.Unchanged != 2500 {
		t.Fatalf("a, listing 2500: %+v", st)
	}
	if st := rep.Sources[1].Stats; st.Skipped != 500 || st.Unchanged != 1000 {
		t.Fatalf("b: %+v, want a's 500 skipped", st)
	}
	if n := serverCount(t, f, `SELECT count(*) FROM servers WHERE source = 'a' AND status <> 'ORPHANED'`); n != 3000 {
		t.Fatalf("a keeps %d live servers, want 3000", n)
	}
}
