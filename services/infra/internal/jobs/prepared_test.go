package jobs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Preparations are kept per stream entry and taken back once; one that
// holds nothing costly is not kept; the oldest makes room at the limit; an
// expired one is dropped; whatever is dropped loses its directory.
func TestPreparedJobs(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	entry := func(id string) stream.Entry { return stream.Entry{Stream: "ansible:job:queue", ID: id} }
	prep := func(t *testing.T, costly bool) *preparedJob {
		dir := t.TempDir()
		p := &preparedJob{dir: filepath.Join(dir, "job")}
		if err := os.Mkdir(p.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if costly {
			p.src = &checkedOut{commit: "c0ffee"}
		}
		return p
	}
	exists := func(p *preparedJob) bool { _, err := os.Stat(p.dir); return err == nil }

	tests := []struct {
		name string
		run  func(t *testing.T, ps *preparedJobs)
	}{
		{"kept and taken back once", func(t *testing.T, ps *preparedJobs) {
			p := prep(t, true)
			ps.keep(entry("1-0"), p, now)
			if got := ps.take(entry("1-0"), now.Add(time.Minute)); got != p || !exists(p) {
				t.Fatalf("take = %v (dir there: %v), want the kept preparation", got, exists(p))
			}
			if got := ps.take(entry("1-0"), now); got != nil {
				t.Errorf("taken twice: %+v", got)
			}
		}},
		{"another entry's is not given", func(t *testing.T, ps *preparedJobs) {
			ps.keep(entry("1-0"), prep(t, true), now)
			if got := ps.take(entry("2-0"), now); got != nil {
				t.Errorf("take of another entry = %+v, want nil", got)
			}
		}},
		{"nothing costly is not kept", func(t *testing.T, ps *preparedJobs) {
			p := prep(t, false)
			ps.keep(entry("1-0"), p, now)
			if ps.count() != 0 || exists(p) {
				t.Errorf("kept %d, dir there: %v; want none kept, its dir removed", ps.count(), exists(p))
			}
		}},
		{"the oldest makes room", func(t *testing.T, ps *preparedJobs) {
			old, mid, young := prep(t, true), prep(t, true), prep(t, true)
			ps.keep(entry("1-0"), old, now)
			ps.keep(entry("2-0"), mid, now.Add(time.Second))
			ps.keep(entry("3-0"), young, now.Add(2*time.Second))
			if ps.count() != 2 || exists(old) || !exists(mid) || !exists(young) {
				t.Errorf("kept %d; dirs old %v mid %v young %v; want the oldest dropped", ps.count(), exists(old), exists(mid), exists(young))
			}
		}},
		{"expired ones are dropped", func(t *testing.T, ps *preparedJobs) {
			p := prep(t, true)
			ps.keep(entry("1-0"), p, now)
			if got := ps.take(entry("1-0"), now.Add(time.Hour)); got != nil || exists(p) {
				t.Errorf("take after the ttl = %+v (dir there: %v), want nil and its dir removed", got, exists(p))
			}
		}},
		{"close drops all", func(t *testing.T, ps *preparedJobs) {
			p, q := prep(t, true), prep(t, true)
			ps.keep(entry("1-0"), p, now)
			ps.keep(entry("2-0"), q, now)
			ps.close()
			if ps.count() != 0 || exists(p) || exists(q) {
				t.Errorf("after close: %d kept, dirs %v %v", ps.count(), exists(p), exists(q))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, newPreparedJobs(2, 10*time.Minute))
		})
	}
}
