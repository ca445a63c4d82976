package fleet_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

const (
	projA = "aaaaaaaa-0000-4000-8000-000000000001"
	projB = "bbbbbbbb-0000-4000-8000-000000000002"
)

func TestCanonicalProjects(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		in   string
		want []string
		bad  bool
	}{
		{"empty is fleet-only", "", []string{}, false},
		{"one", projA, []string{projA}, false},
		{"sorted, lower-cased, deduplicated", " BBBBBBBB-0000-4000-8000-000000000002, " + projA + " " + projA, []string{projA, projB}, false},
		{"not a project id", "tenant-b", nil, true},
		{"one bad of two", projA + ",x", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fleet.ParseProjects(tt.in)
			if (err != nil) != tt.bad {
				t.Fatalf("ParseProjects(%q) error %v, want bad=%v", tt.in, err, tt.bad)
			}
			if !tt.bad && !slices.Equal(got, tt.want) {
				t.Fatalf("ParseProjects(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestSetProjects(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	ctx := ctxT(t)
	insert(t, b.db, "own-1", "READY", nil)
	if srv := mustGet(t, s, "own-1"); len(srv.Projects) != 0 || srv.Projects == nil || srv.ProjectsFromSource {
		t.Fatalf("a new server: projects %#v from source %v, want fleet-only", srv.Projects, srv.ProjectsFromSource)
	}
	srv, err := s.SetProjects(ctx, "own-1", []string{projB, "AAAAAAAA-0000-4000-8000-000000000001"}, "alice", "tenant onboarding")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(srv.Projects, []string{projA, projB}) || !srv.OwnedBy(projA) || srv.OwnedByOthers(projB) {
		t.Fatalf("projects %q", srv.Projects)
	}
	if got := mustGet(t, s, "own-1"); !slices.Equal(got.Projects, []string{projA, projB}) || got.Version != srv.Version {
		t.Fatalf("stored projects %q version %d, want %q version %d", got.Projects, got.Version, srv.Projects, srv.Version)
	}
	// The same owners again change nothing (no history row, no version).
	again, err := s.SetProjects(ctx, "own-1", []string{projA, projB}, "alice", "")
	if err != nil || again.Version != srv.Version {
		t.Fatalf("setting the same owners: version %d -> %d, %v", srv.Version, again.Version, err)
	}
	if _, err := s.SetProjects(ctx, "own-1", []string{}, "bob", ""); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, "own-1"); len(got.Projects) != 0 || got.OwnedByOthers(projA) {
		t.Fatalf("after clearing: %q", got.Projects)
	}
	if ev := events(t, s, "own-1"); !slices.Equal(ev, []string{"projects READY->READY by alice", "projects READY->READY by bob"}) {
		t.Fatalf("history %q", ev)
	}
	hist, _ := s.History(ctx, "own-1", 1)
	if want := "projects: none (fleet-only) (were " + projA + ", " + projB + ")"; hist[0].Reason != want {
		t.Fatalf("reason %q, want %q", hist[0].Reason, want)
	}
	// A status change keeps the owners (the transition writes them as read).
	if _, err := s.SetProjects(ctx, "own-1", []string{projA}, "alice", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, fleet.TransitionRequest{Handle: "own-1", To: fleet.StatusFailed, Actor: "infra"}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, "own-1"); !slices.Equal(got.Projects, []string{projA}) {
		t.Fatalf("after a transition: %q", got.Projects)
	}

	for _, tt := range []struct {
		name     string
		handle   string
		projects []string
		want     error
	}{
		{"not a project id", "own-1", []string{"tenant-b"}, fleet.ErrInvalid},
		{"unknown server", "nope", []string{projA}, fleet.ErrNotFound},
	} {
		if _, err := s.SetProjects(ctx, tt.handle, tt.projects, "alice", ""); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}

	// Listing by owner.
	insert(t, b.db, "own-2", "READY", nil)
	page, err := s.List(ctx, fleet.Filter{Project: projA}, "", 0)
	if err != nil || len(page.Servers) != 1 || page.Servers[0].Handle != "own-1" {
		t.Fatalf("servers of A: %v %v", page, err)
	}
	page, err = s.List(ctx, fleet.Filter{Project: "-", Search: "own-"}, "", 0)
	if err != nil || len(page.Servers) != 1 || page.Servers[0].Handle != "own-2" {
		t.Fatalf("fleet-only servers: %v %v", page, err)
	}
}

// A source that says who owns its servers sets them on every sync; an
// operator cannot change them, and a source that stops saying leaves the
// server fleet-only. A source that never says leaves an operator's owners.
func TestSyncSetsProjects(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := ctxT(t)
	src := "static:/inv/projects-" + t.Name()
	sync := func(servers ...fleet.Detected) {
		t.Helper()
		if _, err := s.Sync(ctx, fleet.SyncRequest{Source: src, Servers: servers, Actor: "detector"}); err != nil {
			t.Fatal(err)
		}
	}
	sync(fleet.Detected{Handle: "sp-1", Address: "192.0.2.71", Projects: []string{projB, projA}},
		fleet.Detected{Handle: "sp-2", Address: "192.0.2.72"})
	one, two := mustGet(t, s, "sp-1"), mustGet(t, s, "sp-2")
	if !slices.Equal(one.Projects, []string{projA, projB}) || !one.ProjectsFromSource {
		t.Fatalf("sp-1: %q from source %v", one.Projects, one.ProjectsFromSource)
	}
	if len(two.Projects) != 0 || two.ProjectsFromSource {
		t.Fatalf("sp-2: %q from source %v", two.Projects, two.ProjectsFromSource)
	}
	if _, err := s.SetProjects(ctx, "sp-1", []string{projB}, "alice", ""); !errors.Is(err, fleet.ErrNotAllowed) {
		t.Fatalf("an operator on a source-owned server: %v, want ErrNotAllowed", err)
	}
	if _, err := s.SetProjects(ctx, "sp-2", []string{projB}, "alice", ""); err != nil {
		t.Fatal(err)
	}
	// The source changes sp-1's owners, says nothing more of sp-2: the
	// operator's owners of sp-2 stay.
	sync(fleet.Detected{Handle: "sp-1", Address: "192.0.2.71", Projects: []string{projB}},
		fleet.Detected{Handle: "sp-2", Address: "192.0.2.72", Labels: map[string]string{"x": "1"}})
	if got := mustGet(t, s, "sp-1").Projects; !slices.Equal(got, []string{projB}) {
		t.Fatalf("sp-1 after the source changed: %q", got)
	}
	if got := mustGet(t, s, "sp-2").Projects; !slices.Equal(got, []string{projB}) {
		t.Fatalf("sp-2 after a sync that says nothing of owners: %q", got)
	}
	// The source stops saying: sp-1 is fleet-only, and an operator's again.
	sync(fleet.Detected{Handle: "sp-1", Address: "192.0.2.71"}, fleet.Detected{Handle: "sp-2", Address: "192.0.2.72"})
	if got := mustGet(t, s, "sp-1"); len(got.Projects) != 0 || got.ProjectsFromSource {
		t.Fatalf("sp-1 after the source stopped saying: %q from source %v", got.Projects, got.ProjectsFromSource)
	}
	// A source listing a bad project id changes nothing.
	_, err := s.Sync(ctx, fleet.SyncRequest{Source: src, Actor: "detector",
		Servers: []fleet.Detected{{Handle: "sp-1", Address: "192.0.2.71", Projects: []string{"tenant-b"}}}})
	if !errors.Is(err, fleet.ErrInvalid) {
		t.Fatalf("a bad project id: %v, want ErrInvalid", err)
	}
}
