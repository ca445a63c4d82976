package ansible

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The gate lets the takeover (remote.go) run while ansible-playbook starts
// up instead of before it: Python's start, the plugins, the inventory and
// the playbook take ansible-playbook longer than the takeover's SSH session
// takes, and nothing of that reaches the target. The autoprov_events
// callback plugin waits at the gate, a FIFO in the run directory
// (AUTOPROV_GATE_PATH), before the first play's first task: the runner
// writes "go" once the takeover is done, or stops the run and closes the
// gate, which ends ansible-playbook before any task. A task event that
// arrives while the gate is shut stops the run (a plugin that does not
// wait): no task of the run may overlap earlier runs' work on the target.

// gate is the runner's end of a run's gate FIFO.
type gate struct {
	path string
	f    *os.File // held open (read-write) so the plugin's open never blocks

	mu       sync.Mutex
	opened   bool
	openedAt time.Time
	closed   bool
}

// newGate creates the gate FIFO (0600, the play user's) in the run dir.
func (d *runDir) newGate() (*gate, error) {
	path := filepath.Join(d.path, "gate")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("gate fifo: %w", err)
	}
	if err := d.own(path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("gate fifo: %w", err)
	}
	d.gate = path
	return &gate{path: path, f: f}, nil
}

// open lets the play's tasks start; it does nothing once the gate is
// closed. The FIFO stays open (until close): the plugin may reach the gate
// later, and a FIFO keeps its data only while someone holds it.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.opened {
		return
	}
	// Opened before the write: the first task's event may arrive before
	// the write returns, and must not look like a breach.
	g.opened, g.openedAt = true, time.Now()
	_, _ = g.f.Write([]byte("go\n")) // 3 bytes: within the pipe's buffer, never blocks
}

// close shuts the gate for good (the run is stopped, or ansible-playbook
// exited): a plugin waiting at a gate never opened reads no "go" and ends
// ansible-playbook. Idempotent.
func (g *gate) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	_ = g.f.Close()
}

// isOpen reports whether the gate was opened, and when.
func (g *gate) isOpen() (bool, time.Time) {
	if g == nil {
		return false, time.Time{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened, g.openedAt
}
