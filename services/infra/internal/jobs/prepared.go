package jobs

import (
	"os"
	"sync"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/inventory"
)

// An Ansible job whose hosts another run holds waits in its stream and
// looks again (waitBusy). What it prepared before it found them busy, the
// costly part of its look (its inventory fetched and listed, its source
// checked out, its requirements installed, its plays found or generated),
// is kept on this instance for its next look, so that a job prepares once
// however long it waits: the next look reads it back and goes to its locks.
//
// Only that is kept. What is cheap and may change while the job waits is
// done at every look: its references authorized, its hosts located (a
// server's owner and key as they are now) and authorized. A look on
// another instance (a claim after this one died or drained) prepares
// again; what this one kept expires.
//
// No secret is ever kept: a credential a preparation needed (a git token)
// is resolved for it and not kept, and the credentials of the run and its
// secret vars (options.secret_vars) are resolved by the run itself, under
// its locks (ansibleJob.run), at every run.

// preparedJob is what one waiting job prepared: its private directory and
// what was done in it.
type preparedJob struct {
	dir  string
	kept time.Time // when it was kept; expired after preparedJobs.ttl

	inv *resolvedInventory // nil: not resolved (inline, or not yet)
	src *checkedOut        // nil: not checked out yet
}

// resolvedInventory is a git, URL or dynamic inventory resolved
// (JobInventories.Resolve): its file in the job's directory (git, URL), its
// hosts, its commit (git) and the plugin that reads its file.
type resolvedInventory struct {
	file    string
	hosts   []inventory.Host
	commit  string
	enabled string
}

// checkedOut is a job's source checked out in its directory, its
// requirements installed and its plays found or generated.
type checkedOut struct {
	commit    string            // "" for a collection role
	env       map[string]string // where the requirements are (ANSIBLE_*_PATH)
	playbooks []string          // absolute paths, in order
	names     []string          // the playbooks as the result names them
}

// costly reports whether anything of the job was worth keeping.
func (p *preparedJob) costly() bool { return p.inv != nil || p.src != nil }

// preparedJobs are the waiting jobs' preparations on this instance, by
// their stream entry (the same request, whatever its delivery).
type preparedJobs struct {
	max int           // at most this many kept; the oldest goes first
	ttl time.Duration // a preparation not taken back within it is dropped

	mu   sync.Mutex
	jobs map[stream.Entry]*preparedJob
}

// Defaults of preparedJobs.
const (
	defaultPreparedMax = 32
	defaultPreparedTTL = 15 * time.Minute
)

func newPreparedJobs(max int, ttl time.Duration) *preparedJobs {
	if max <= 0 {
		max = defaultPreparedMax
	}
	if ttl <= 0 {
		ttl = defaultPreparedTTL
	}
	return &preparedJobs{max: max, ttl: ttl, jobs: map[stream.Entry]*preparedJob{}}
}

// take returns the preparation kept for entry, which is no longer kept, or
// nil when none is.
func (ps *preparedJobs) take(e stream.Entry, now time.Time) *preparedJob {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	p := ps.jobs[e]
	delete(ps.jobs, e)
	return p
}

// keep keeps p for entry's next look when it holds anything costly, or
// removes its directory. The oldest preparation makes room when max are
// kept.
func (ps *preparedJobs) keep(e stream.Entry, p *preparedJob, now time.Time) {
	if !p.costly() {
		_ = os.RemoveAll(p.dir)
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	if old, ok := ps.jobs[e]; ok && old != p {
		_ = os.RemoveAll(old.dir)
	}
	for len(ps.jobs) >= ps.max {
		var oldest stream.Entry
		var at time.Time
		for k, q := range ps.jobs {
			if at.IsZero() || q.kept.Before(at) {
				oldest, at = k, q.kept
			}
		}
		_ = os.RemoveAll(ps.jobs[oldest].dir)
		delete(ps.jobs, oldest)
	}
	p.kept = now
	ps.jobs[e] = p
}

// drop removes p's directory: the job ran or ended.
func (ps *preparedJobs) drop(p *preparedJob) { _ = os.RemoveAll(p.dir) }

// expire drops the preparations older than ttl; the caller holds mu.
func (ps *preparedJobs) expire(now time.Time) {
	for e, p := range ps.jobs {
		if now.Sub(p.kept) >= ps.ttl {
			_ = os.RemoveAll(p.dir)
			delete(ps.jobs, e)
		}
	}
}

// close drops every preparation (at shutdown).
func (ps *preparedJobs) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for e, p := range ps.jobs {
		_ = os.RemoveAll(p.dir)
		delete(ps.jobs, e)
	}
}

// count is how many preparations are kept.
func (ps *preparedJobs) count() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.jobs)
}
