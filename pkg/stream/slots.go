package stream

import (
	"context"
	"sync"
	"sync/atomic"
)

// slots counts free handler slots. Taking and returning slots is a single
// atomic operation on the hot path; a waiter parks on a one-token channel
// that every return signals without blocking.
type slots struct {
	free atomic.Int64
	wake chan struct{}
}

func newSlots(n int) *slots {
	s := &slots{wake: make(chan struct{}, 1)}
	s.free.Store(int64(n))
	return s
}

// available returns the number of free slots.
func (s *slots) available() int { return int(max(s.free.Load(), 0)) }

// acquire blocks for one free slot, then takes more without blocking, up to
// max in all. It returns 0 when ctx is done.
func (s *slots) acquire(ctx context.Context, max int) int {
	for {
		if n := s.tryAcquire(max); n > 0 {
			return n
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return 0
		}
	}
}

// tryAcquire takes up to max free slots without blocking.
func (s *slots) tryAcquire(max int) int {
	for {
		free := s.free.Load()
		if free <= 0 || max <= 0 {
			return 0
		}
		n := min(free, int64(max))
		if s.free.CompareAndSwap(free, free-n) {
			if free > n {
				s.signal() // let another waiter see the rest
			}
			return int(n)
		}
	}
}

// release returns n slots.
func (s *slots) release(n int) {
	if n <= 0 {
		return
	}
	s.free.Add(int64(n))
	s.signal()
}

func (s *slots) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// ackQueue collects settled deliveries for the ack loop. Pushing takes a
// mutex and, when the queue was empty, signals the loop without blocking.
type ackQueue struct {
	mu    sync.Mutex
	items []*delivery
	wake  chan struct{}
}

func newAckQueue() *ackQueue { return &ackQueue{wake: make(chan struct{}, 1)} }

func (q *ackQueue) push(d *delivery) {
	q.mu.Lock()
	q.items = append(q.items, d)
	first := len(q.items) == 1
	q.mu.Unlock()
	if first {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// take removes and returns everything queued.
func (q *ackQueue) take() []*delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

func (q *ackQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
