package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// resultFollower follows provisioner:results with blocking reads, as the
// scheduler does, so that a benchmark's client learns of a result as soon as
// it is published and costs the machine one read per result. (waitProvision
// polls the whole stream every 20 ms: fine for a test, but in a benchmark its
// latency and its reads of an ever longer stream count against infra.)
type resultFollower struct {
	mu   sync.Mutex
	cond *sync.Cond
	got  map[string]*messages.ProvisionerResult // first result per job id
	err  error
}

// followResults starts a follower from the stream's start; it stops with
// the test.
func (e *e2e) followResults(tb testing.TB) *resultFollower {
	f := &resultFollower{got: map[string]*messages.ProvisionerResult{}}
	f.cond = sync.NewCond(&f.mu)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tb.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		last := "0-0"
		for ctx.Err() == nil {
			streams, err := e.rdb.XRead(ctx, &redis.XReadArgs{
				Streams: []string{messages.StreamProvisionerResults, last}, Count: 100, Block: time.Second,
			}).Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond) // Redis hiccup: read again
				}
				continue
			}
			f.mu.Lock()
			for _, s := range streams {
				for _, m := range s.Messages {
					last = m.ID
					r, err := messages.DecodeProvisionerResult([]byte(m.Values["data"].(string)))
					if err != nil {
						f.err = err
						continue
					}
					if _, seen := f.got[r.JobID]; !seen {
						f.got[r.JobID] = r
					}
				}
			}
			f.mu.Unlock()
			f.cond.Broadcast()
		}
	}()
	return f
}

// wait returns the first result of jobID, or an error after timeout. It
// may be called from any goroutine.
func (f *resultFollower) wait(jobID string, timeout time.Duration) (*messages.ProvisionerResult, error) {
	timer := time.AfterFunc(timeout, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.cond.Broadcast()
	})
	defer timer.Stop()
	deadline := time.Now().Add(timeout)
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if f.err != nil {
			return nil, fmt.Errorf("undecodable result: %w", f.err)
		}
		if r, ok := f.got[jobID]; ok {
			return r, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("timed out after %v waiting for the result of %s", timeout, jobID)
		}
		f.cond.Wait()
	}
}
