package deployments

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Notifier tells every replica that a deployment reached its final state:
// the replica that recorded it publishes the job id on a Redis channel, and
// each replica wakes its local watchers (requests waiting with ?wait=,
// event streams). Pub/sub may lose a message while a replica reconnects, so
// watchers also re-check the database now and then; a notification only
// makes them faster.
type Notifier struct {
	rdb     redis.UniversalClient
	channel string
	log     zerolog.Logger

	mu       sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
	ready    chan struct{}
	once     sync.Once
}

// NewNotifier returns a notifier on channel.
func NewNotifier(rdb redis.UniversalClient, channel string, log zerolog.Logger) *Notifier {
	return &Notifier{rdb: rdb, channel: channel, log: log, watchers: map[string]map[chan struct{}]struct{}{}, ready: make(chan struct{})}
}

// Ready is closed once the notifier listens.
func (n *Notifier) Ready() <-chan struct{} { return n.ready }

// Run listens until ctx is done.
func (n *Notifier) Run(ctx context.Context) error {
	sub := n.rdb.Subscribe(ctx, n.channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn().Err(err).Msg("subscribe to deployment notifications (retrying in the background)")
	}
	n.once.Do(func() { close(n.ready) })
	ch := sub.Channel(redis.WithChannelHealthCheckInterval(0))
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			n.wake(m.Payload)
		}
	}
}

// Publish announces that jobID reached its final state. Local watchers are
// woken at once, others through Redis.
func (n *Notifier) Publish(ctx context.Context, jobID string) {
	n.wake(jobID)
	if err := n.rdb.Publish(ctx, n.channel, jobID).Err(); err != nil {
		n.log.Warn().Err(err).Str("job_id", jobID).Msg("publish deployment notification")
	}
}

func (n *Notifier) wake(jobID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.watchers[jobID] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Watch returns a channel that receives when jobID is announced, and a
// function to stop watching.
func (n *Notifier) Watch(jobID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.watchers[jobID] == nil {
		n.watchers[jobID] = map[chan struct{}]struct{}{}
	}
	n.watchers[jobID][ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.watchers[jobID], ch)
		if len(n.watchers[jobID]) == 0 {
			delete(n.watchers, jobID)
		}
	}
}
