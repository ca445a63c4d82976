package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

// memRuns is a RunSource over a slice, with the semantics the real ones
// have: created_at and id order, Position by time for other kinds.
type memRuns struct {
	kind string
	runs []Run
}

func (m memRuns) Kind() string           { return m.kind }
func (m memRuns) Visible(*auth.Key) bool { return true }
func (m memRuns) Runs(_ *http.Request, _ RunFilter, before *Position, limit int) ([]Run, error) {
	out := slices.Clone(m.runs)
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID > out[j].ID
	})
	var kept []Run
	for _, r := range out {
		switch {
		case before == nil:
		case before.Kind == m.kind:
			if !(r.CreatedAt.Before(before.At) || (r.CreatedAt.Equal(before.At) && r.ID < before.ID)) {
				continue
			}
		default:
			if !r.CreatedAt.Before(before.until(m.kind)) {
				continue
			}
		}
		kept = append(kept, r)
	}
	return kept[:min(limit, len(kept))], nil
}

// TestListRunsPagesAcrossKinds pages through three kinds (as deployments,
// jobs and provisioning runs) whose runs share creation times: every run
// comes once, in order.
func TestListRunsPagesAcrossKinds(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var a, b, j []Run
	for i := range 7 {
		a = append(a, Run{Kind: "deployment", ID: fmt.Sprintf("d%d", i), CreatedAt: at.Add(time.Duration(i/2) * time.Second)})
		b = append(b, Run{Kind: "provision", ID: fmt.Sprintf("p%d", i), CreatedAt: at.Add(time.Duration(i/3) * time.Second)})
		j = append(j, Run{Kind: "job", ID: fmt.Sprintf("j%d", i), CreatedAt: at.Add(time.Duration(i/2) * time.Second)})
	}
	c := &Console{deps: Deps{Runs: []RunSource{memRuns{"deployment", a}, memRuns{"job", j}, memRuns{"provision", b}}}}
	r, _ := http.NewRequestWithContext(context.WithValue(context.Background(), ctxAuth, &authInfo{key: &auth.Key{}}), "GET", "/", nil)
	for _, limit := range []int{1, 2, 3, 5, 14, 21, 30} {
		var got []string
		var before *Position
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("the pages never end")
			}
			runs, next, err := c.listRuns(r, "", RunFilter{}, before, limit)
			if err != nil {
				t.Fatal(err)
			}
			for i, run := range runs {
				got = append(got, run.ID)
				if i > 0 && run.CreatedAt.After(runs[i-1].CreatedAt) {
					t.Fatalf("limit %d: not newest first: %v", limit, runs)
				}
			}
			if next == nil {
				break
			}
			// The cursor survives its encoding.
			if before, err = decodePosition(encodePosition(next)); err != nil || *before != *next {
				t.Fatalf("position %v round trip: %v %v", next, before, err)
			}
		}
		if len(got) != 21 {
			t.Fatalf("limit %d: %d runs, want 21: %v", limit, len(got), got)
		}
		seen := map[string]bool{}
		for _, id := range got {
			if seen[id] {
				t.Fatalf("limit %d: %s twice: %v", limit, id, got)
			}
			seen[id] = true
		}
	}
	for _, bad := range []string{"!", "bm90LWEtY3Vyc29y", encodePosition(&Position{At: at, Kind: "x"})[:5]} {
		if _, err := decodePosition(bad); err == nil {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}

func TestHourlyChart(t *testing.T) {
	since := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	c := hourlyChart(since, map[time.Time]map[string]int{
		since:                     {"succeeded": 3, "failed": 1},
		since.Add(5 * time.Hour):  {"running": 2},
		since.Add(30 * time.Hour): {"failed": 9}, // outside the day
	})
	if c.Total != 6 || c.Max != 4 || len(c.Bars) != 24 || len(c.Ticks) != 4 {
		t.Fatalf("chart %+v", c)
	}
	if len(c.Bars[0].Rects) != 2 || c.Bars[0].Title != "00:00 UTC: 3 succeeded 1 failed" || c.Bars[1].Title != "01:00 UTC: no runs" {
		t.Fatalf("first bars: %+v %+v", c.Bars[0], c.Bars[1])
	}
	if top := c.Bars[0].Rects[1]; top.Y != 10 {
		t.Fatalf("the tallest bar does not reach the top: %+v", top)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/ui/fleet": "/ui/fleet", "": "/ui/", "https://evil.example/": "/ui/", "//evil.example": "/ui/",
		"/ui/\\evil": "/ui/", "/api/v1/keys": "/ui/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}
