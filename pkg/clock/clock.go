// Package clock is the one time source of the code that waits or stamps
// times: a Clock interface, the real clock (System) and Sleep, a wait that
// ends with its context. Code that waits takes a Clock so that its tests
// can drive time with clocktest.Fake instead of sleeping.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and waits.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives the time once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

// System returns the real clock (time.Now, time.After).
func System() Clock { return system{} }

type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Sleep waits d on c (nil: the system clock) or until ctx is done, and
// returns ctx's error in that case, nil otherwise. A wait of d <= 0 only
// checks ctx.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	var fired <-chan time.Time
	switch c.(type) {
	case nil, system:
		// A timer of its own, released at once when ctx ends first.
		t := time.NewTimer(d)
		defer t.Stop()
		fired = t.C
	default:
		fired = c.After(d)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-fired:
		return nil
	}
}
