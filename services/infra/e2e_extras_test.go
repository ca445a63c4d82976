package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestExtraPlaybooksRunInOrderAndStopAtTheFirstFailure runs the real infra
// binary and ansible-playbook over SSH: the extra playbooks of a request run
// one after the other after setup, the first failure stops the rest, and
// the result lists each playbook's outcome; an unknown playbook rejects the
// request before anything runs.
func TestExtraPlaybooksRunInOrderAndStopAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra()

	e.provision("job-extras-fail", "web-1", func(m *messages.ProvisionerMessage) {
		m.Playbooks = []string{"extra_a.yml", "extra_fails.yml", "extra_b.yml"}
	})
	r := e.waitProvision("job-extras-fail", 3*time.Minute) // three plays
	if r.Status != messages.StatusFailed || r.Error == nil || r.Error.Kind != messages.KindPlaybookFailed ||
		r.Playbook != "extra_fails.yml" || r.FailedTask == nil || r.FailedTask.Name != "Planned failure" {
		t.Fatalf("result = %s %s %+v %+v", r.Status, r.Playbook, r.Error, r.FailedTask)
	}
	steps := func(r *messages.ProvisionerResult) []string {
		var out []string
		for _, p := range r.Playbooks {
			out = append(out, p.Playbook+" "+string(p.Status))
		}
		return out
	}
	want := []string{"setup_server.yml succeeded", "extra_a.yml succeeded", "extra_fails.yml failed", "extra_b.yml skipped"}
	if got := steps(r); !slices.Equal(got, want) {
		t.Errorf("playbooks = %v, want %v", got, want)
	}
	var names []string
	spans := e.spans("web-1")
	for _, s := range spans {
		names = append(names, s.playbook)
	}
	if !slices.Equal(names, []string{"setup_server", "extra_a", "extra_fails"}) || spans[1].end == 0 || spans[2].end != 0 {
		t.Fatalf("runs on the server = %+v", spans)
	}
	assertNoOverlap(t, spans)
	if s := e.server("web-1"); s.Status != store.ServerFailed {
		t.Errorf("server %s", s.Status)
	}

	e.provision("job-extras-ok", "web-1", func(m *messages.ProvisionerMessage) {
		m.Playbooks = []string{"extra_b.yml", "extra_a.yml"}
	})
	r = e.waitProvision("job-extras-ok", 3*time.Minute) // three plays
	want = []string{"setup_server.yml succeeded", "extra_b.yml succeeded", "extra_a.yml succeeded"}
	if r.Status != messages.StatusSucceeded || r.Playbook != "extra_a.yml" || !slices.Equal(steps(r), want) {
		t.Fatalf("result = %s %s %v %+v", r.Status, r.Playbook, steps(r), r.Error)
	}
	if s := e.server("web-1"); s.Status != store.ServerReady {
		t.Errorf("server %s", s.Status)
	}

	before := len(e.spans("web-1"))
	e.provision("job-extras-unknown", "web-1", func(m *messages.ProvisionerMessage) {
		m.Playbooks = []string{"extra_a.yml", "not_there.yml"}
	})
	r = e.waitProvision("job-extras-unknown", 3*time.Minute)
	if r.Status != messages.StatusRejected || r.Error == nil || len(r.Error.Fields) != 1 ||
		r.Error.Fields[0].Field != "playbooks[1]" || len(r.Playbooks) != 0 {
		t.Fatalf("result = %s %+v %v", r.Status, r.Error, steps(r))
	}
	e.waitAcked(messages.StreamProvisionerQueue, time.Minute)
	if n := e.rdb.XLen(context.Background(), messages.StreamProvisionerQueue+":dead").Val(); n != 1 {
		t.Errorf("%d dead letters, want the rejected request", n)
	}
	if after := len(e.spans("web-1")); after != before {
		t.Errorf("a rejected request ran %d playbooks", after-before)
	}
}
