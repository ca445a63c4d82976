package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// warmMasters lists the warm SSH masters infra keeps under runRoot.
func warmMasters(runRoot string) []int {
	var out []int
	for _, p := range processesMentioning(runRoot + "/ar-w") {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		if strings.Contains(string(cmd), "ControlMaster=yes") {
			out = append(out, p)
		}
	}
	return out
}

// playProcesses lists the processes mentioning runRoot but for the warm
// masters (which outlive runs by design).
func playProcesses(runRoot string) []int {
	warm := warmMasters(runRoot)
	var out []int
	for _, p := range processesMentioning(runRoot) {
		if !slices.Contains(warm, p) {
			out = append(out, p)
		}
	}
	return out
}

// TestWarmConnectionsAcrossJobs runs provisioning jobs of one server with
// SSH_WARM_CONNECTIONS on: the second job logs in to the server not once
// (the sshd's log), its play goes through the master the first job
// opened; the master goes with infra, on SIGTERM and on SIGKILL.
func TestWarmConnectionsAcrossJobs(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	logins := func() int { return strings.Count(sshd.Log(), "Accepted publickey") }
	// The check is reused for the whole test: what is left is the play's.
	warm := []string{"SSH_WARM_CONNECTIONS=true", "SSH_CHECK_REUSE=10m", "SSH_CHECK_REUSE_SHARED=false"}

	p := e.infra(warm...)
	e.provision("warm-1", "web-1")
	if r := e.waitProvision("warm-1", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("warm-1: %s %+v", r.Status, r.Error)
	}
	first := logins()
	e.provision("warm-2", "web-1")
	if r := e.waitProvision("warm-2", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("warm-2: %s %+v", r.Status, r.Error)
	}
	if got := logins() - first; got != 0 {
		t.Fatalf("the second job logged in %d times; want 0 (the first job's warm connection)", got)
	}
	masters := warmMasters(e.runRoot)
	if len(masters) != 1 {
		t.Fatalf("warm masters %v, want one", masters)
	}
	if m := p.metrics(t); !strings.Contains(m, "\nautoprov_infra_warm_connections 1\n") {
		t.Fatalf("metrics do not count the one warm master:\n%s", grepLines(m, "warm_connections"))
	}
	// SIGTERM: infra closes its masters and leaves the run root empty.
	p.Signal(syscall.SIGTERM)
	p.Wait(time.Minute)
	if left := warmMasters(e.runRoot); len(left) > 0 {
		t.Fatalf("warm masters left after infra stopped: %v", left)
	}
	assertRunRootEmpty(t, e.runRoot)

	// SIGKILL: the master dies with infra (Pdeathsig); the next infra
	// sweeps its directory.
	p = e.infra(warm...)
	e.provision("warm-3", "web-1")
	if r := e.waitProvision("warm-3", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("warm-3: %s %+v", r.Status, r.Error)
	}
	masters = warmMasters(e.runRoot)
	if len(masters) != 1 {
		t.Fatalf("warm masters %v, want one", masters)
	}
	p.Signal(syscall.SIGKILL)
	p.Wait(time.Minute)
	testenv.WaitFor(t, 30*time.Second, "the warm master to die with infra", func() bool { return len(warmMasters(e.runRoot)) == 0 })
	p = e.infra()
	testenv.WaitFor(t, time.Minute, "the sweep of the warm directory", func() bool {
		ents, _ := os.ReadDir(e.runRoot)
		return len(ents) == 0
	})
	p.Signal(syscall.SIGTERM)
	p.Wait(time.Minute)
}

// TestWarmConnectionsNeverForJobs: an Ansible job on a server that has a
// warm connection (same address, port, user and key as infra's own runs)
// logs in on its own and leaves no warm connection of its own: jobs run
// the callers' playbooks and never use warm masters.
func TestWarmConnectionsNeverForJobs(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	sshd := w.sshds[0]
	w.addServer("web-1", sshd)
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	w.start("SSH_WARM_CONNECTIONS=true", "SSH_CHECK_REUSE=10m", "SSH_CHECK_REUSE_SHARED=false")
	logins := func() int { return strings.Count(sshd.Log(), "Accepted publickey") }

	w.provision("warm-p", "web-1")
	if r := w.waitProvision("warm-p", 3*time.Minute); r.Status != messages.StatusSucceeded {
		t.Fatalf("warm-p: %s %+v", r.Status, r.Error)
	}
	masters := warmMasters(w.runRoot)
	if len(masters) != 1 {
		t.Fatalf("warm masters %v after the provisioning run, want one", masters)
	}
	before := logins()
	w.submit(w.job("warm-job", map[string]messages.Vars{"t1": w.host(0)}, "site.yml"))
	jobStatus(t, w.waitJob("warm-job", 3*time.Minute), messages.StatusSucceeded, "")
	if got := logins() - before; got == 0 {
		t.Fatal("the job logged in to the server not once: it went through the warm connection")
	}
	if m := warmMasters(w.runRoot); !slices.Equal(m, masters) {
		t.Fatalf("warm masters %v after the job, want the provisioning run's %v alone", m, masters)
	}
	ents, _ := os.ReadDir(w.runRoot)
	if len(ents) != 1 {
		t.Fatalf("run root after the job: %v, want the one warm directory", ents)
	}
}
