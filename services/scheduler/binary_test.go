package main

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The binary keeps the linker's pruning of unused methods: no function
// reachable from main calls methods by a run-time name (what gRPC's
// golang.org/x/net/trace pages did through html/template until the
// grpcnotrace tag left them out; docs/performance.md, idle RSS).
func TestBinaryKeepsUnusedMethodsOut(t *testing.T) {
	t.Parallel()
	if callers := testenv.ReflectMethodCallers(t, "."); len(callers) > 0 {
		t.Fatalf("reachable functions call methods by a run-time name, so every exported method is linked in: %v", callers)
	}
}
