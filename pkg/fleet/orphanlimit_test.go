package fleet_test

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// TestOrphanLimit pins the orphan guard's rule at every size: a source
// never orphans all of its servers at once, one at a time always works,
// and MAX_ORPHAN_FRACTION=1 turns the guard off.
func TestOrphanLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		live int
		f    float64
		want int
	}{
		{0, 0.5, 0},
		{1, 0.5, 0}, // the last server never goes by itself
		{2, 0.5, 1},
		{3, 0.5, 1}, // emptied (3) or cut to one host (2): refused
		{10, 0.5, 5},
		{100, 0.5, 50},
		{1, 0.1, 0},
		{3, 0.1, 1}, // one at a time always works
		{10, 0.1, 1},
		{100, 0.1, 10},
		{100, 0.29, 29}, // not 28: 0.29*100 is 28.999... in floats
		{2, 0.99, 1},
		{10, 0.99, 9},
		{100, 0.99, 99},
		{1, 1, 1}, // the guard is off
		{3, 1, 3},
		{100, 1, 100},
	} {
		if got := fleet.OrphanLimit(c.live, c.f); got != c.want {
			t.Errorf("OrphanLimit(%d, %g) = %d, want %d", c.live, c.f, got, c.want)
		}
	}
}
