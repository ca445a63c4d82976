package testenv

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// HoldFirstPipeline makes the first pipeline rdb sends from now on wait
// until release is called (a Redis that falls behind, for tests of what
// happens meanwhile); entered is closed once that pipeline waits. release
// may be called more than once; tests defer it.
func HoldFirstPipeline(rdb *redis.Client) (entered <-chan struct{}, release func()) {
	in, hold := make(chan struct{}), make(chan struct{})
	var first, done sync.Once
	rdb.AddHook(pipelineHook(func() {
		first.Do(func() {
			close(in)
			<-hold
		})
	}))
	return in, func() { done.Do(func() { close(hold) }) }
}

// pipelineHook calls f before each pipeline is sent.
type pipelineHook func()

func (h pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h()
		return next(ctx, cmds)
	}
}
