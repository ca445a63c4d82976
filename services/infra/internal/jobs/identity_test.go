package jobs_test

import (
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// TestJobIDReusedAcrossKinds: a deploy reusing a provisioning job's id is
// rejected clearly; the provisioning result is not published on
// deploy:results, and nothing runs.
func TestJobIDReusedAcrossKinds(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.addServer(t, "web-1")
	f := w.newFakes()
	h := w.handler(t, f, nil)
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 1), nil); err != nil {
		t.Fatal(err)
	}
	msg := w.message(t, messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "job-1"}, ProjectID: authzProject, RepoFullName: "acme/shop",
		Branch: "main", ServerIP: "192.0.2.10", Port: 8080,
	}, 1)
	if err := handle(t, h, nil, msg, nil); err != nil {
		t.Fatal(err)
	}
	rs := w.deployResults(t, "job-1")
	if len(rs) != 1 {
		t.Fatalf("%d deploy results, want 1", len(rs))
	}
	checkResult(t, &rs[0].Outcome, messages.StatusRejected, messages.KindInvalidMessage, "already the id of a provision job")
	if n := len(f.runner.calls()); n != 1 {
		t.Errorf("%d plays, want the provisioning's only", n)
	}
	if r := w.run(t, "job-1"); r.Kind != "provision" || r.Status != string(messages.StatusSucceeded) {
		t.Errorf("run row %s %s: the provisioning's row changed", r.Kind, r.Status)
	}
}

// TestHandlesGetUniqueAliases: servers whose handles cannot be inventory
// names (too long, ':' or '@') are provisioned, each under a name of its
// own, so they never share a fact cache.
func TestHandlesGetUniqueAliases(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	f := w.newFakes()
	h := w.handler(t, f, nil)
	handles := []string{strings.Repeat("h", 100), "db@eu:1", "db@eu:2"}
	for i, hd := range handles {
		w.addServer(t, hd)
		jobID := "job-alias-" + string(rune('a'+i))
		if err := handle(t, h, nil, w.provision(t, jobID, hd, 1), nil); err != nil {
			t.Fatal(err)
		}
		if r := w.provisionResults(t, jobID); len(r) != 1 || r[0].Status != messages.StatusSucceeded {
			t.Fatalf("%s: results %+v", hd, r)
		}
		if s := w.server(t, hd); s.Status != store.ServerReady {
			t.Errorf("%s: server %s", hd, s.Status)
		}
	}
	seen := map[string]bool{}
	for _, sp := range f.runner.calls() {
		if seen[sp.Host.Alias] {
			t.Errorf("alias %q used for two servers", sp.Host.Alias)
		}
		seen[sp.Host.Alias] = true
		if len(sp.Host.Alias) > 63 || strings.ContainsAny(sp.Host.Alias, ":@") {
			t.Errorf("alias %q is no inventory name", sp.Host.Alias)
		}
	}
	if len(seen) != len(handles) {
		t.Errorf("%d aliases for %d servers", len(seen), len(handles))
	}
}
