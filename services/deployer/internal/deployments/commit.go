package deployments

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group commit of submits. Every new deployment costs a committed INSERT
// (a WAL flush) and an XADD; under load, submits that arrive while others
// are being stored wait for the next group, which is stored with one
// round trip and one commit (a pgx batch: one implicit transaction) and
// published with one pipelined XADD per entry in one round trip. A lone
// submit goes out at once, as a group of one: nothing waits for a timer.
const (
	// maxCommitGroup bounds the submits stored and published together.
	maxCommitGroup = 128
	// maxCommitters bounds the groups being stored at once.
	maxCommitters = 4
	// commitTimeout bounds storing and publishing one group.
	commitTimeout = 10 * time.Second
)

// commitItem is one submit waiting for its group.
type commitItem struct {
	id   string
	args []any  // the INSERT's arguments
	data []byte // the encoded request, for the queue
	err  error  // the store's error; publishing failures are not the submit's
	done chan struct{}
}

// committer collects submits into groups (see the constants above).
type committer struct {
	s *Service

	mu      sync.Mutex
	queue   []*commitItem
	running int // committers running
}

// commit stores and publishes it with the next group and waits until that
// is done. The wait does not end with ctx: once queued, the deployment is
// stored and published whether or not the client still waits (bounded by
// commitTimeout).
func (c *committer) commit(it *commitItem) error {
	it.done = make(chan struct{})
	c.mu.Lock()
	c.queue = append(c.queue, it)
	start := c.running < maxCommitters
	if start {
		c.running++
	}
	c.mu.Unlock()
	if start {
		go c.run()
	}
	<-it.done
	return it.err
}

// run commits groups until the queue is empty.
func (c *committer) run() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.running--
			c.queue = nil // let a large backing array go
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxCommitGroup)
		group := c.queue[:n:n]
		c.queue = c.queue[n:]
		c.mu.Unlock()
		c.commitGroup(group)
	}
}

// commitGroup stores the group in one transaction (each submit on its own
// when the group fails, so that one bad row fails only its request), then
// publishes the stored ones in one pipeline. A publishing failure is
// logged, not returned: the deployments are stored, and the republisher
// publishes them once Redis answers again.
func (c *committer) commitGroup(group []*commitItem) {
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	defer func() {
		for _, it := range group {
			close(it.done)
		}
	}()
	if err := c.insert(ctx, group); err != nil {
		if len(group) == 1 {
			group[0].err = err
		} else {
			for _, it := range group {
				it.err = c.insert(ctx, []*commitItem{it})
			}
		}
	}
	stored := make([]*commitItem, 0, len(group))
	data := make([][]byte, 0, len(group))
	for _, it := range group {
		if it.err == nil {
			stored = append(stored, it)
			data = append(data, it.data)
		}
	}
	if len(stored) == 0 {
		return
	}
	s.metrics.commitGroup.Observe(float64(len(stored)))
	entries, err := s.producer.PublishBatch(ctx, s.cfg.Streams.Queue, data)
	if err != nil {
		s.metrics.publishFailures.Add(float64(len(stored)))
		s.log.Warn().Err(err).Int("deployments", len(stored)).Msg("publish deployments: will be retried by the republisher")
		return
	}
	for i, it := range stored {
		s.marker.mark(it.id, entries[i])
		s.own.add(it.id)
	}
}

// insert stores the group's deployments with one round trip and one
// commit.
func (c *committer) insert(ctx context.Context, group []*commitItem) error {
	if len(group) == 1 {
		_, err := c.s.db.Exec(ctx, insertDeployment, group[0].args...)
		return err
	}
	b := &pgx.Batch{}
	for _, it := range group {
		b.Queue(insertDeployment, it.args...)
	}
	if err := c.s.db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("store %d deployments: %w", len(group), err)
	}
	return nil
}
