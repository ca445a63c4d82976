package service

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// SignalError is the cause (context.Cause) of a context canceled by a
// shutdown signal.
type SignalError struct {
	Signal os.Signal
}

// Error implements error.
func (e *SignalError) Error() string { return "received " + e.Signal.String() }

// SignalExitCode is the exit status for a process ended by sig: 128 plus the
// signal number, as shells report it (130 for SIGINT, 143 for SIGTERM).
func SignalExitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// WithShutdownSignals returns a copy of parent that is canceled, with a
// *SignalError as its cause, by the first SIGINT or SIGTERM: the service
// drains and returns. A second signal calls exit(SignalExitCode(sig)) at
// once (130 for SIGINT, 143 for SIGTERM), without waiting for the drain;
// exit nil means os.Exit, tests inject their own.
//
// stop cancels the context and restores the default signal handling; call
// it once the run function returned.
func WithShutdownSignals(parent context.Context, exit func(code int)) (ctx context.Context, stop func()) {
	if exit == nil {
		exit = os.Exit
	}
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	ctx, release := handleSignals(parent, ch, exit)
	return ctx, func() {
		signal.Stop(ch)
		release()
	}
}

// handleSignals is WithShutdownSignals on a channel of signals.
func handleSignals(parent context.Context, signals <-chan os.Signal, exit func(code int)) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case sig := <-signals:
			cancel(&SignalError{Signal: sig})
		case <-done:
			return
		}
		select {
		case sig := <-signals:
			exit(SignalExitCode(sig))
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			close(done)
			<-finished
			cancel(context.Canceled)
		})
	}
}
