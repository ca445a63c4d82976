package service

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary act as a service (signalHelper) instead
// of running tests; its value is the drain: "quick" or "stuck".
const helperEnv = "SERVICE_TEST_SIGNAL_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(signalHelper(mode))
	}
	goleak.VerifyTestMain(m)
}

// signalHelper is the main of a service: it prints "ready", waits for the
// shutdown signal, prints "draining: <cause>", drains and returns its exit
// status. A "stuck" drain never ends, so only a second signal ends the process.
func signalHelper(mode string) int {
	ctx, stop := WithShutdownSignals(context.Background(), nil)
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("draining:", context.Cause(ctx))
	if mode == "stuck" {
		time.Sleep(time.Hour) // only the second signal gets us out
	}
	fmt.Println("drained")
	return 0
}

func TestShutdownSignalsProcess(t *testing.T) {
	tests := []struct {
		name     string
		sig      syscall.Signal
		mode     string
		wantCode int
	}{
		{"SIGTERM drains and exits 0", syscall.SIGTERM, "quick", 0},
		{"SIGINT drains and exits 0", syscall.SIGINT, "quick", 0},
		{"second SIGTERM exits 143", syscall.SIGTERM, "stuck", 143},
		{"second SIGINT exits 130", syscall.SIGINT, "stuck", 130},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"="+tt.mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := bufio.NewScanner(out)
			expect := func(want string) {
				t.Helper()
				if !lines.Scan() {
					t.Fatalf("helper ended before printing %q: %v", want, lines.Err())
				}
				if lines.Text() != want {
					t.Fatalf("helper printed %q, want %q", lines.Text(), want)
				}
			}
			expect("ready")
			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			expect("draining: received " + tt.sig.String())
			if tt.mode == "stuck" {
				if err := cmd.Process.Signal(tt.sig); err != nil {
					t.Fatal(err)
				}
			} else {
				expect("drained")
			}
			_, _ = io.Copy(io.Discard, out)
			err = cmd.Wait()
			var exitErr *exec.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				t.Fatal(err)
			}
			if got := cmd.ProcessState.ExitCode(); got != tt.wantCode {
				t.Errorf("exit status %d (%v), want %d", got, cmd.ProcessState, tt.wantCode)
			}
		})
	}
}

// TestHandleSignals drives the handler with a channel instead of real signals.
func TestHandleSignals(t *testing.T) {
	signals := make(chan os.Signal, 2)
	exits := make(chan int, 1)
	ctx, stop := handleSignals(context.Background(), signals, func(code int) { exits <- code })
	defer stop()

	signals <- syscall.SIGTERM
	<-ctx.Done()
	var sigErr *SignalError
	if cause := context.Cause(ctx); !errors.As(cause, &sigErr) || sigErr.Signal != syscall.SIGTERM {
		t.Fatalf("cause %v, want a SignalError for SIGTERM", cause)
	}
	select {
	case code := <-exits:
		t.Fatalf("exit(%d) after the first signal", code)
	default:
	}
	signals <- syscall.SIGINT
	if code := <-exits; code != 130 {
		t.Errorf("exit(%d) after a second SIGINT, want 130", code)
	}
}

func TestHandleSignalsStop(t *testing.T) {
	signals := make(chan os.Signal, 1)
	ctx, stop := handleSignals(context.Background(), signals, func(code int) { t.Errorf("exit(%d)", code) })
	stop()
	stop() // idempotent
	if !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("cause after stop: %v", context.Cause(ctx))
	}
	// stop waited for the handler goroutine to end (goleak checks it is
	// gone): a later signal cannot call exit.
}

func TestSignalExitCode(t *testing.T) {
	for sig, want := range map[os.Signal]int{syscall.SIGINT: 130, syscall.SIGTERM: 143, os.Interrupt: 130} {
		if got := SignalExitCode(sig); got != want {
			t.Errorf("SignalExitCode(%v) = %d, want %d", sig, got, want)
		}
	}
	if !strings.Contains((&SignalError{Signal: syscall.SIGTERM}).Error(), "terminated") {
		t.Error("SignalError does not name the signal")
	}
}
