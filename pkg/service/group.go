package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// Component is one long-running part of a service: a consumer loop, a
// ticker, an HTTP server.
type Component struct {
	// Name identifies the component in logs and errors.
	Name string
	// Run does the work until ctx is canceled, then returns nil once it has
	// stopped cleanly (returning ctx's error then counts as clean too). An
	// error, or returning before being asked to stop, stops the whole group.
	Run func(ctx context.Context) error
	// Drain, when set, is called as soon as shutdown begins, before any
	// component is stopped: the admin server turns /readyz to 503 here.
	Drain func()
}

// ErrStoppedEarly is wrapped in the error of a component whose Run returned
// nil before it was asked to stop.
var ErrStoppedEarly = errors.New("stopped before shutdown")

// RunComponents runs the components concurrently in an errgroup until ctx
// is done or one of them fails, then shuts them down in a stated order:
//
//  1. every Drain hook is called (readiness turns 503 first);
//  2. the components are stopped one at a time in reverse order, each
//     one's context canceled only after the one after it has returned.
//
// So list them like deferred calls in reverse: what others depend on first
// (the admin server, which must answer until the end), the readers that
// feed work in last (they stop first, before what they feed).
//
// The whole shutdown may take grace (<= 0: no limit); components still
// running then are abandoned and reported in the error. It returns nil after a clean
// shutdown requested through ctx, and otherwise the first component error.
func RunComponents(ctx context.Context, logger zerolog.Logger, grace time.Duration, components ...Component) error {
	type running struct {
		Component
		cancel context.CancelFunc
		done   chan struct{}
	}
	base := context.WithoutCancel(ctx) // components stop when we cancel them, in order
	g, failed := errgroup.WithContext(base)
	parts := make([]*running, len(components))
	for i, c := range components {
		cctx, cancel := context.WithCancel(base)
		r := &running{Component: c, cancel: cancel, done: make(chan struct{})}
		parts[i] = r
		g.Go(func() error {
			defer close(r.done)
			err := r.Run(cctx)
			switch {
			case cctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)):
				return nil
			case err == nil:
				return fmt.Errorf("%s: %w", r.Name, ErrStoppedEarly)
			}
			return fmt.Errorf("%s: %w", r.Name, err)
		})
	}

	select {
	case <-ctx.Done():
		logger.Info().Str("reason", context.Cause(ctx).Error()).Msg("shutting down")
	case <-failed.Done(): // errgroup cancels with the first error as cause
		logger.Error().Err(context.Cause(failed)).Msg("component failed, shutting down")
	}
	for _, r := range parts {
		if r.Drain != nil {
			r.Drain()
		}
	}
	var deadline <-chan time.Time // nil: no limit
	if grace > 0 {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		deadline = timer.C
	}
	for i := len(parts) - 1; i >= 0; i-- {
		r := parts[i]
		r.cancel()
		select {
		case <-r.done:
			logger.Debug().Str("component", r.Name).Msg("stopped")
		case <-deadline:
			var left []string
			for _, r := range parts[:i+1] {
				r.cancel()
				select {
				case <-r.done:
				default:
					left = append(left, r.Name)
				}
			}
			err := fmt.Errorf("shutdown grace %s exceeded, still running: %s", grace, strings.Join(left, ", "))
			if failed.Err() != nil && ctx.Err() == nil {
				err = errors.Join(context.Cause(failed), err)
			}
			return err
		}
	}
	return g.Wait()
}
