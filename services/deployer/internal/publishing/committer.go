package publishing

import (
	"context"
	"sync"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Group commit of submits. Every new deployment costs a committed INSERT
// (a WAL flush) and an XADD; submits that arrive while a group is being
// stored wait for the next group, which is stored with one multi-row
// INSERT (one statement, one round trip, one commit: a batch of one INSERT
// per row cost Postgres about half as much again), published with one
// pipelined XADD per entry in one round trip, and marked published with
// one row for the whole group. A lone submit goes out at once, as a group
// of one: nothing waits for a timer.
//
// Under sustained load (the inserter has just stored a group) and while
// the next group is small, the inserter lingers for commitLinger before it
// takes it, so that groups hold a few more submits: each group costs a
// statement, a commit, a pipeline and their round trips whatever its size,
// and at 2,000 submits/s half a millisecond cuts the CPU per submit of the
// deployer, Postgres and Redis together by about a quarter (BenchmarkSubmit)
// for about a millisecond more at the median. A submit that finds the
// inserter idle goes out at once.
//
// One group is stored at a time. Concurrent INSERTs into deployments all
// touch the same few index pages (every index ends in created_at or a
// UUIDv7), and on these 2-core machines four concurrent committers cost
// Postgres about 1.5 times the CPU per submit of one (BenchmarkSubmit at
// 2,000/s: 250-290 µs against 170 µs), which queued every request for
// CPU. One inserter lets the groups grow with the load instead. Publishing
// a stored group overlaps the storing of the next one.
const (
	// maxCommitGroup bounds the submits stored and published together.
	maxCommitGroup = 128
	// maxPublishing bounds the stored groups being published at once; the
	// inserter waits for a free slot before it stores another group.
	maxPublishing = 4
	// commitTimeout bounds storing and publishing one group.
	commitTimeout = 10 * time.Second
	// commitLinger is how long the busy inserter waits for a small group
	// to grow; lingerBelow is the size from which it does not wait.
	commitLinger = 500 * time.Microsecond
	lingerBelow  = 8
)

// commitItem is one submit waiting for its group.
type commitItem struct {
	row  *deployments.Row
	data []byte // the encoded request, for the queue
	err  error  // the store's error; publishing failures are not the submit's
	// entry is the queue entry id the request was published as ("" when
	// publishing failed: the republisher publishes it later).
	entry string
	done  chan struct{}
}

// committer collects submits into groups (see the constants above).
type committer struct {
	p *Publisher

	mu      sync.Mutex
	queue   []*commitItem
	running bool // the inserter runs

	publishing chan struct{} // one token per group being published
}

func newCommitter(p *Publisher) *committer {
	return &committer{p: p, publishing: make(chan struct{}, maxPublishing)}
}

// commit stores and publishes it with the next group and waits until that
// is done. The wait does not end with ctx: once queued, the deployment is
// stored and published whether or not the client still waits (bounded by
// commitTimeout).
func (c *committer) commit(it *commitItem) error {
	it.done = make(chan struct{})
	c.mu.Lock()
	c.queue = append(c.queue, it)
	start := !c.running
	c.running = true
	c.mu.Unlock()
	if start {
		go c.run()
	}
	<-it.done
	return it.err
}

// run stores groups until the queue is empty (lingering between groups
// while they are small), and hands each stored group to a goroutine of its
// own to publish.
func (c *committer) run() {
	for busy := false; ; busy = true {
		if busy {
			c.mu.Lock()
			small := len(c.queue) < lingerBelow
			c.mu.Unlock()
			if small {
				time.Sleep(commitLinger)
			}
		}
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.running = false
			c.queue = nil // let a large backing array go
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxCommitGroup)
		group := c.queue[:n:n]
		c.queue = c.queue[n:]
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		c.store(ctx, group)
		c.publishing <- struct{}{}
		go func() {
			defer func() { <-c.publishing }()
			defer cancel()
			c.publish(ctx, group)
		}()
	}
}

// store stores the group with one multi-row INSERT (each submit on its own
// when that fails, so that one bad row fails only its request); a submit
// that was not stored gets its error.
func (c *committer) store(ctx context.Context, group []*commitItem) {
	// The group is named after its first deployment (a fresh UUIDv7, so
	// never another group's name).
	groupID := group[0].row.ID
	rows := make([]*deployments.Row, len(group))
	for i, it := range group {
		rows[i] = it.row
	}
	if err := deployments.InsertGroup(ctx, c.p.db, groupID, rows); err != nil {
		if len(group) == 1 {
			group[0].err = err
			return
		}
		for i, it := range group {
			it.err = deployments.InsertRow(ctx, c.p.db, it.row, groupID, i+1)
		}
	}
}

// publish publishes the stored submits of the group in one pipeline, marks
// the group published with one row (see the publish marker) and ends the
// submits' waits. A publishing failure is logged, not returned: the
// deployments are stored, and the republisher publishes them once Redis
// answers again.
func (c *committer) publish(ctx context.Context, group []*commitItem) {
	p := c.p
	defer func() {
		for _, it := range group {
			close(it.done)
		}
	}()
	data := make([][]byte, 0, len(group))
	for _, it := range group {
		if it.err == nil {
			data = append(data, it.data)
			// Stored, so the observer must skip it: known before the XADD,
			// which the observer may read before PublishBatch returns.
			p.own.add(it.row.ID)
		}
	}
	if len(data) == 0 {
		return
	}
	p.metrics.commitGroup.Observe(float64(len(data)))
	published, err := p.producer.PublishBatch(ctx, p.cfg.Queue, data)
	if err != nil {
		p.metrics.publishFailures.Add(float64(len(data)))
		p.log.Warn().Err(err).Int("deployments", len(data)).Msg("publish deployments: will be retried by the republisher")
		return
	}
	entries := make([]string, len(group)) // by position; "" where not stored
	for i, it := range group {
		if it.err == nil {
			entries[i], published = published[0], published[1:]
			it.entry = entries[i]
		}
	}
	p.marker.markGroup(group[0].row.ID, entries)
}
