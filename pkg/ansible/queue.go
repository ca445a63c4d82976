package ansible

import "sync"

// eventQueue is an unbounded FIFO between the event reader and OnEvent, so
// that a slow consumer never blocks ansible-playbook's writes.
type eventQueue struct {
	mu     sync.Mutex
	items  []Event
	closed bool
	ready  chan struct{} // has a token when items or closed changed
}

func newEventQueue() *eventQueue { return &eventQueue{ready: make(chan struct{}, 1)} }

func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	q.items = append(q.items, ev)
	q.mu.Unlock()
	q.wake()
}

func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wake()
}

func (q *eventQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the next event; false when the queue is closed and empty.
func (q *eventQueue) pop() (Event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return ev, true
		}
		if q.closed {
			q.mu.Unlock()
			return Event{}, false
		}
		q.mu.Unlock()
		<-q.ready
	}
}
