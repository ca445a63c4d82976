package jobs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// xaddOrder is a Redis hook that slows down every XADD to the progress
// streams (job:<kind>:<id>:events) and records, in order, when each XADD to a
// progress stream ended and when each XADD to another stream began.
type xaddOrder struct {
	mu  sync.Mutex
	log []string // "events done" / "<stream> start"
}

func (o *xaddOrder) note(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = append(o.log, s)
}

func (o *xaddOrder) around(cmds []redis.Cmder, next func() error) error {
	progress := false
	for _, c := range cmds {
		args := c.Args()
		if len(args) < 2 || !strings.EqualFold(c.Name(), "xadd") {
			continue
		}
		stream, _ := args[1].(string)
		if strings.HasPrefix(stream, "job:") && strings.HasSuffix(stream, ":events") {
			progress = true
		} else {
			o.note(stream + " start")
		}
	}
	if progress {
		time.Sleep(40 * time.Millisecond) // a Redis slow to take the events
	}
	err := next()
	if progress {
		o.note("events done")
	}
	return err
}

func (o *xaddOrder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (o *xaddOrder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return o.around([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}
func (o *xaddOrder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return o.around(cmds, func() error { return next(ctx, cmds) })
	}
}

// TestResultAfterLastProgressEvent: the result goes out only once every
// progress event of the run, run_finished included, is in Redis, even when
// Redis takes the events slowly; a reader that sees the result and then
// reads the events finds them all.
func TestResultAfterLastProgressEvent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	order := &xaddOrder{}
	w.rdb.AddHook(order)
	w.addServer(t, "web-1")
	f := w.newFakes()
	h := w.handler(t, f, nil)
	if err := handle(t, h, nil, w.provision(t, "job-order", "web-1", 1), nil); err != nil {
		t.Fatal(err)
	}
	if r := w.provisionResults(t, "job-order"); len(r) != 1 || r[0].Status != messages.StatusSucceeded {
		t.Fatalf("results %+v", r)
	}
	if types := w.progressTypes(t, messages.JobKindProvision, "job-order"); len(types) == 0 || types[len(types)-1] != messages.EventRunFinished {
		t.Fatalf("progress %v", types)
	}
	order.mu.Lock()
	defer order.mu.Unlock()
	lastEvents, result := -1, -1
	for i, e := range order.log {
		switch e {
		case "events done":
			lastEvents = i
		case messages.StreamProvisionerResults + " start":
			if result < 0 {
				result = i
			}
		}
	}
	if lastEvents < 0 || result < 0 || result < lastEvents {
		t.Errorf("the result went out before the last progress event reached Redis: %v", order.log)
	}
}
