package stream

import (
	"context"
	"sync"
	"sync/atomic"
)

// slots counts free handler slots. It is fair: while a reader waits, a
// returned slot goes to the reader that has waited longest and nobody else
// takes slots, so a reader looping on a quiet stream cannot starve the
// reader of a busy one (with Concurrency below the number of streams,
// readers take turns). While nobody waits, taking and returning slots are
// single atomic operations (the hot path of fast handlers).
//
// A waiter counts itself in nwait before it looks at free, and a returner
// adds to free before it looks at nwait; so either the waiter sees the
// returned slots, or the returner sees the waiter and hands them over under
// the mutex. No wakeup is lost.
type slots struct {
	free  atomic.Int64
	nwait atomic.Int64
	mu    sync.Mutex
	queue []chan struct{} // waiting readers, FIFO; guarded by mu
}

func newSlots(n int) *slots {
	s := &slots{}
	s.free.Store(int64(n))
	return s
}

// available returns the number of free slots.
func (s *slots) available() int { return int(max(s.free.Load(), 0)) }

// take takes up to max free slots with CAS; it does not look at waiters.
func (s *slots) take(max int) int {
	for {
		free := s.free.Load()
		if free <= 0 || max <= 0 {
			return 0
		}
		n := min(free, int64(max))
		if s.free.CompareAndSwap(free, free-n) {
			return int(n)
		}
	}
}

// acquire blocks for one free slot, then takes more without blocking, up to
// max in all. It returns 0 when ctx is done.
func (s *slots) acquire(ctx context.Context, max int) int {
	if n := s.tryAcquire(max); n > 0 {
		return n
	}
	s.mu.Lock()
	s.nwait.Add(1)
	if len(s.queue) == 0 {
		if n := s.take(max); n > 0 {
			s.nwait.Add(-1)
			s.mu.Unlock()
			return n
		}
	}
	ch := make(chan struct{}, 1)
	s.queue = append(s.queue, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return 1 + s.tryAcquire(max-1)
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, w := range s.queue {
			if w == ch {
				s.queue = append(s.queue[:i], s.queue[i+1:]...)
				s.nwait.Add(-1)
				return 0
			}
		}
		// Handed a slot just as ctx ended: pass it on.
		s.free.Add(1)
		s.handOverLocked()
		return 0
	}
}

// tryAcquire takes up to max free slots without blocking; it takes none
// while a reader waits.
func (s *slots) tryAcquire(max int) int {
	if s.nwait.Load() > 0 {
		return 0
	}
	return s.take(max)
}

// release returns n slots, handing them to waiting readers first.
func (s *slots) release(n int) {
	if n <= 0 {
		return
	}
	s.free.Add(int64(n))
	if s.nwait.Load() == 0 {
		return
	}
	s.mu.Lock()
	s.handOverLocked()
	s.mu.Unlock()
}

// handOverLocked gives free slots to waiting readers, one each, in order.
func (s *slots) handOverLocked() {
	for len(s.queue) > 0 && s.take(1) == 1 {
		s.queue[0] <- struct{}{}
		s.queue = s.queue[1:]
		s.nwait.Add(-1)
	}
}

// ackQueue collects settled deliveries for the ack loop. Pushing takes a
// mutex and, when the queue was empty, signals the loop without blocking;
// a push into a full queue waits until the loop takes what is queued.
type ackQueue struct {
	mu    sync.Mutex
	items []*delivery
	wake  chan struct{}
	room  chan struct{} // closed by take; made by a push that waits for room
}

func newAckQueue() *ackQueue { return &ackQueue{wake: make(chan struct{}, 1)} }

// push queues d once fewer than limit deliveries are queued. It returns
// false, queuing nothing, when ctx ends first.
func (q *ackQueue) push(ctx context.Context, d *delivery, limit int) bool {
	q.mu.Lock()
	for len(q.items) >= limit {
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return false
		}
		q.mu.Lock()
	}
	q.items = append(q.items, d)
	first := len(q.items) == 1
	q.mu.Unlock()
	if first {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// take removes and returns everything queued.
func (q *ackQueue) take() []*delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	return items
}
