package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestAnsibleJobArtifacts: the set_stats data of a job's two playbooks is
// its result's artifacts, merged in order (the second playbook's value of a
// key wins), typed as Ansible set it; a name a workflow could not pass on
// as an extra var is left out, the rest kept.
func TestAnsibleJobArtifacts(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	w.repo.Commit(t, map[string]string{
		"build.yml": `- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.set_stats:
        data: {version: "1.0", build: 7, ansible_become: true}
`,
		"publish.yml": `- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.set_stats:
        data: {version: "1.1", url: "https://example.invalid/1.1"}
`,
	})
	w.start()
	m := w.job("job-artifacts", map[string]messages.Vars{"t1": w.host(0)}, "build.yml", "publish.yml")
	w.submit(m)
	r := w.waitJob("job-artifacts", 3*time.Minute)
	jobStatus(t, r, messages.StatusSucceeded, "")
	want := messages.Vars{"version": "1.1", "build": int64(7), "url": "https://example.invalid/1.1"}
	if !reflect.DeepEqual(r.Artifacts, want) {
		t.Errorf("artifacts %#v, want %#v", r.Artifacts, want)
	}
}
