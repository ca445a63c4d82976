package ansible

import (
	"context"
	"strings"
	"testing"

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
