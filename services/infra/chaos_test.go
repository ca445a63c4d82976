//go:build chaos

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestChaos is the short form of the fault-injection run (make chaos):
// three infra replicas take provisioning requests for three servers while
// replicas are killed with -9 and stopped with SIGTERM at random points and
// restarted; afterwards every request must have a result, no job two
// different results, no server two overlapping runs, and no entry may be
// left pending. CHAOS_SEED repeats a run.
func TestChaos(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
	}
	t.Logf("CHAOS_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	hosts := []string{"web-1", "web-2", "web-3"}
	var e *e2e
	var first *testenv.SSHD
	for i, h := range hosts {
		sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
		if i == 0 {
			e, first = newE2E(t, sshd), sshd
		} else {
			// infra has one SSH key: every server authorizes the first's.
			f, err := os.OpenFile(filepath.Join(sshd.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = fmt.Fprintln(f, first.ClientPublicKey)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		e.addServer(h, sshd)
		e.control(h, map[string]any{"sleep": 2})
	}
	replicas := []*infraProc{e.infra(), e.infra(), e.infra()}
	const requests = 12
	for i := range requests {
		e.provision(fmt.Sprintf("job-%d", i), hosts[i%len(hosts)])
	}

	// Faults at random points while the requests run.
	for round := range 4 {
		time.Sleep(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
		i := rng.IntN(len(replicas))
		if round%2 == 0 {
			t.Logf("round %d: kill -9 of replica %d", round, i)
			replicas[i].Signal(syscall.SIGKILL)
			replicas[i].Wait(10 * time.Second)
		} else {
			t.Logf("round %d: SIGTERM of replica %d", round, i)
			replicas[i].Signal(syscall.SIGTERM)
			if code := replicas[i].Wait(time.Minute); code != 0 {
				t.Errorf("replica %d exited %d after SIGTERM", i, code)
			}
		}
		replicas[i] = e.infra()
	}

	// Settle, then count.
	lost, conflicting, overlaps := 0, 0, 0
	deadline := time.Now().Add(4 * time.Minute)
	for i := range requests {
		id := fmt.Sprintf("job-%d", i)
		for len(e.provisionResults(id)) == 0 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
	}
	e.waitAcked(messages.StreamProvisionerQueue, 2*time.Minute)
	for i := range requests {
		id := fmt.Sprintf("job-%d", i)
		rs := e.provisionResults(id)
		if len(rs) == 0 {
			lost++
			t.Errorf("%s: no result", id)
			continue
		}
		for _, r := range rs[1:] {
			if r.Status != rs[0].Status || r.Attempt != rs[0].Attempt || r.StartedAt != rs[0].StartedAt {
				conflicting++
				t.Errorf("%s: two different results: %+v and %+v", id, rs[0].Outcome, r.Outcome)
			}
		}
		if rs[0].Status != messages.StatusSucceeded {
			t.Errorf("%s: %s %+v", id, rs[0].Status, rs[0].Error)
		}
	}
	for _, h := range hosts {
		spans := e.spans(h)
		for k := 1; k < len(spans); k++ {
			if spans[k-1].end != 0 && spans[k].start < spans[k-1].end {
				overlaps++
			}
		}
		assertNoOverlap(t, spans)
	}
	t.Logf("| requests | lost | conflicting results | overlapping runs |")
	t.Logf("| %d | %d | %d | %d |", requests, lost, conflicting, overlaps)
}
