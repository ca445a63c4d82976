package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
)

// TestListeningOnlyOnceServing: the readiness check the deployer registers
// for its API fails until Run listens, so /readyz never says ready while
// API_ADDR refuses connections; it passes while Run serves.
func TestListeningOnlyOnceServing(t *testing.T) {
	t.Parallel()
	a, err := api.New(api.Config{Addr: "127.0.0.1:0", ShutdownGrace: time.Second}, api.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Listening(ctx); err == nil {
		t.Fatal("Listening passed before Run")
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	_ = a.Addr() // returns once Run listens
	if err := a.Listening(ctx); err != nil {
		t.Errorf("Listening while serving: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
