package ansible

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// twoHostPlay runs a task that works on every host, one whose failure a
// rescue catches, then one that fails (on purpose) on the hosts it reaches.
const twoHostPlay = `- name: Two hosts
  hosts: all
  gather_facts: false
  tasks:
    - name: Works
      ansible.builtin.ping:

    - name: Guarded
      block:
        - name: Caught
          ansible.builtin.fail:
            msg: rescued failure
      rescue:
        - name: Rescue
          ansible.builtin.ping:

    - name: Breaks
      ansible.builtin.fail:
        msg: broken on purpose
`

// TestRunJobFailedTaskOverUnreachable: of a job's two hosts one cannot be
// reached (nothing listens on its port) and the other fails a task after
// one that worked and a failure its rescue caught. The failed task is the
// one that failed, on its host, not the unreachable host's first task nor
// the rescued one; the error names both hosts.
func TestRunJobFailedTaskOverUnreachable(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	js := jobOn(s, jobDir(t, twoHostPlay, "-"))
	js.Hosts[0].Alias = "up"
	js.Hosts = append(js.Hosts, JobHost{Host: Host{Alias: "down", Address: "127.0.0.1", Port: testenv.ClosedPort(t),
		User: s.User, KnownHostsKey: testHostKey(t)}})
	// One attempt: Ansible's reconnections would only repeat the refusal.
	js.Vars = map[string]any{"ansible_ssh_retries": 0}
	res, err := r.RunJob(context.Background(), js)
	if err != nil {
		t.Fatalf("RunJob: %v", err)
	}
	if res.Outcome != OutcomeFailed {
		t.Errorf("outcome %s exit %d, want failed: %v\n%s", res.Outcome, res.ExitCode, res.Err, res.OutputTail)
	}
	if got, want := res.Hosts["up"], (Recap{OK: 2, Failed: 1, Rescued: 1}); got != want {
		t.Errorf("recap of up %+v, want %+v", got, want)
	}
	if got := res.Hosts["down"]; got.Unreachable != 1 {
		t.Errorf("recap of down %+v, want unreachable", got)
	}
	ft := res.FailedTask
	if ft == nil || ft.Name != "Breaks" || ft.Host != "up" || ft.Play != "Two hosts" || ft.Message != "broken on purpose" {
		t.Errorf("FailedTask = %+v, want Breaks on up: broken on purpose", ft)
	}
	if res.Err == nil || !strings.Contains(res.Err.Error(), `failed on up in task "Breaks"`) || !strings.Contains(res.Err.Error(), "host down unreachable") {
		t.Errorf("Err = %v, want the failure on up and the unreachable down", res.Err)
	}
}

// TestRunJobTimeoutNamesTheHost: a job whose time runs out while one of
// its two hosts runs a long task (the other skipped it) has a recap of
// both hosts, from the events so far, and its failed task is the running
// task on the host that was running it.
func TestRunJobTimeoutNamesTheHost(t *testing.T) {
	t.Parallel()
	fast := testenv.StartSSHD(t, testenv.SSHDOptions{})
	slow := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	tmp := targetDir(t)
	play := `- name: Two hosts
  hosts: all
  gather_facts: false
  tasks:
    - name: Works
      ansible.builtin.ping:

    - name: Sleep
      ansible.builtin.command: sleep 300
      changed_when: false
      when: inventory_hostname == "slow"
      # The target is this machine: keep a killed module's payload in
      # the test's own directory.
      environment:
        TMPDIR: ` + tmp + `
`
	js := jobOn(fast, jobDir(t, play, "-"))
	js.Hosts[0].Alias = "fast"
	slowHost := hostOf(slow)
	slowHost.Alias = "slow"
	js.Hosts = append(js.Hosts, JobHost{Host: slowHost})
	js.SSHKeys = [][]byte{fast.ClientKey, slow.ClientKey}
	// Time for ansible-playbook to reach the Sleep task on a loaded
	// machine (Python starts slowly there).
	js.Timeout = 30 * time.Second
	var events eventLog
	js.OnEvent = events.add
	res, err := r.RunJob(context.Background(), js)
	if err != nil {
		t.Fatalf("RunJob: %v", err)
	}
	if res.Outcome != OutcomeTimeout {
		t.Fatalf("outcome %s exit %d, want timeout: %v\n%s", res.Outcome, res.ExitCode, res.Err, res.OutputTail)
	}
	if got, want := res.Hosts["fast"], (Recap{OK: 1, Skipped: 1}); got != want {
		t.Errorf("recap of fast %+v, want %+v (events %v)", got, want, events.types())
	}
	if got, want := res.Hosts["slow"], (Recap{OK: 1}); got != want {
		t.Errorf("recap of slow %+v, want %+v (events %v)", got, want, events.types())
	}
	if ft := res.FailedTask; ft == nil || ft.Name != "Sleep" || ft.Host != "slow" || ft.Play != "Two hosts" {
		t.Errorf("FailedTask = %+v, want Sleep on slow", ft)
	}
	if moduleRunning(tmp) {
		t.Error("the Sleep task's command still runs after the timeout")
	}
}
