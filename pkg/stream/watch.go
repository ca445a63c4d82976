package stream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// KeyWatcherOptions configure a KeyWatcher. The zero value is usable.
type KeyWatcherOptions struct {
	// Interval is how often the watched keys are checked. Default 1s.
	Interval time.Duration
	// Logger receives the watcher's logs. The zero value logs nothing.
	Logger zerolog.Logger
}

// existsBatch bounds the keys checked by one pipeline.
const existsBatch = 1000

// KeyWatcher reports keys that come to exist, such as a job's cancel key
// set by another service (SET job:deploy:<id>:cancel 1). One KeyWatcher serves a
// whole process: every Interval it checks all the keys being watched in one
// pipelined round trip, however many there are, instead of one poll per key
// and watcher. Its goroutine runs only while at least one key is watched.
// It works on any Redis deployment (keys may live in different Cluster
// slots) and needs no server configuration; a Redis error only delays the
// next check.
type KeyWatcher struct {
	rdb      redis.UniversalClient
	interval time.Duration
	log      zerolog.Logger

	mu      sync.Mutex
	watches map[string]map[*keyWatch]struct{} // key -> its watches
	running bool                              // the check loop runs
}

type keyWatch struct {
	fn    func()
	state atomic.Int32  // watchActive, watchFired or watchStopped
	done  chan struct{} // closed once fn returned
}

const (
	watchActive int32 = iota
	watchFired
	watchStopped
)

// NewKeyWatcher returns a KeyWatcher that checks keys through rdb.
func NewKeyWatcher(rdb redis.UniversalClient, opts KeyWatcherOptions) *KeyWatcher {
	interval := opts.Interval
	if interval <= 0 {
		interval = time.Second
	}
	return &KeyWatcher{
		rdb:      rdb,
		interval: interval,
		log:      opts.Logger,
		watches:  map[string]map[*keyWatch]struct{}{},
	}
}

// Watch calls fn once, from the watcher's goroutine, when key is found to
// exist, within about one Interval of it being set; fn must return quickly.
// The returned stop ends the watch; once it returned, fn is not running and
// will not be called. Every Watch needs its stop called.
func (w *KeyWatcher) Watch(key string, fn func()) (stop func()) {
	kw := &keyWatch{fn: fn, done: make(chan struct{})}
	w.mu.Lock()
	ws := w.watches[key]
	if ws == nil {
		ws = map[*keyWatch]struct{}{}
		w.watches[key] = ws
	}
	ws[kw] = struct{}{}
	if !w.running {
		w.running = true
		go w.loop()
	}
	w.mu.Unlock()
	return func() {
		if kw.state.CompareAndSwap(watchActive, watchStopped) {
			w.remove(key, kw)
			return
		}
		if kw.state.Load() == watchFired {
			<-kw.done
		}
	}
}

// Watching returns the number of keys being watched.
func (w *KeyWatcher) Watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.watches)
}

func (w *KeyWatcher) remove(key string, kw *keyWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ws := w.watches[key]; ws != nil {
		delete(ws, kw)
		if len(ws) == 0 {
			delete(w.watches, key)
		}
	}
}

// loop checks the watched keys every interval until none is left.
func (w *KeyWatcher) loop() {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	failing := false
	for range t.C {
		w.mu.Lock()
		if len(w.watches) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		keys := make([]string, 0, len(w.watches))
		for k := range w.watches {
			keys = append(keys, k)
		}
		w.mu.Unlock()

		found, err := w.existing(keys)
		switch {
		case err != nil && !failing:
			failing = true
			w.log.Warn().Err(err).Int("keys", len(keys)).Msg("watched keys not checked: will retry")
		case err == nil && failing:
			failing = false
			w.log.Info().Msg("watched keys checked again")
		}
		for _, k := range found {
			w.fire(k)
		}
	}
}

// existing returns the keys among keys that exist.
func (w *KeyWatcher) existing(keys []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(w.interval, time.Second))
	defer cancel()
	var found []string
	for len(keys) > 0 {
		batch := keys[:min(len(keys), existsBatch)]
		keys = keys[len(batch):]
		pipe := w.rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(batch))
		for i, k := range batch {
			cmds[i] = pipe.Exists(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return found, err
		}
		for i, c := range cmds {
			if c.Val() > 0 {
				found = append(found, batch[i])
			}
		}
	}
	return found, nil
}

// fire calls the functions of key's active watches and ends them.
func (w *KeyWatcher) fire(key string) {
	w.mu.Lock()
	ws := w.watches[key]
	delete(w.watches, key)
	w.mu.Unlock()
	for kw := range ws {
		if kw.state.CompareAndSwap(watchActive, watchFired) {
			func() {
				defer close(kw.done)
				kw.fn()
			}()
		}
	}
}
