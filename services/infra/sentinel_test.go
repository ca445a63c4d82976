package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// Redis behind Sentinel (a primary, a replica, three Sentinels), its
// primary failed over while requests run: infra, configured through
// REDIS_SENTINEL_*, follows the new primary, and every request gets exactly
// one result, succeeded, with nothing left pending and no overlapping runs.
func TestSentinelFailoverLosesNothing(t *testing.T) {
	t.Parallel()
	set := testenv.StartSentinelSet(t)
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.redisURL = "redis://" + set.Primary() + "/0" // with Sentinel only its db and options count
	e.rdb = set.Client()
	sentinel := []string{"REDIS_SENTINEL_MASTER=" + set.Master, "REDIS_SENTINEL_ADDRS=" + strings.Join(set.Addrs(), ",")}

	second := testenv.StartSSHD(t, testenv.SSHDOptions{})
	f, err := os.OpenFile(filepath.Join(second.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintln(f, sshd.ClientPublicKey)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]*testenv.SSHD{"web-1": sshd, "web-2": second}
	e.infra(sentinel...)
	e.infra(sentinel...)
	for h, s := range hosts {
		e.addServer(h, s)
		e.control(h, map[string]any{"sleep": 2})
	}
	const requests = 6
	for i := range requests {
		e.provision(fmt.Sprintf("job-%d", i), fmt.Sprintf("web-%d", i%2+1))
	}
	// The requests are on the replica before the primary goes.
	if n, err := e.rdb.Do(context.Background(), "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d %v", n, err)
	}
	testenv.WaitFor(t, 2*time.Minute, "a run to start on web-1", func() bool { return len(e.spans("web-1")) > 0 })
	old := set.Primary()
	set.Failover()
	t.Logf("failed over from %s to %s mid-run", old, set.Primary())

	// One deadline for all six: three plays in a row per server take
	// four minutes at a load of 20 on two cores, and more under CI's.
	deadline := time.Now().Add(8 * time.Minute)
	for i := range requests {
		id := fmt.Sprintf("job-%d", i)
		r := e.waitProvision(id, time.Until(deadline))
		if r.Status != messages.StatusSucceeded {
			t.Errorf("%s: %s %+v", id, r.Status, r.Error)
		}
	}
	e.waitAcked(messages.StreamProvisionerQueue, 2*time.Minute)
	for i := range requests {
		id := fmt.Sprintf("job-%d", i)
		rs := e.provisionResults(id)
		for _, r := range rs[1:] {
			if r.Status != rs[0].Status || r.StartedAt != rs[0].StartedAt || r.FinishedAt != rs[0].FinishedAt {
				t.Errorf("%s: two different results: %+v and %+v", id, rs[0].Outcome, r.Outcome)
			}
		}
	}
	if dead := e.results(messages.StreamProvisionerQueue + ":dead"); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	for h := range hosts {
		assertNoOverlap(t, e.spans(h))
	}
}
