package ansible

import (
	"context"
	"reflect"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// artifactsPlay sets run-wide set_stats data in two tasks (the second adds
// to the first) and one per-host value, which is not an artifact.
const artifactsPlay = `- name: Artifacts
  hosts: all
  gather_facts: false
  tasks:
    - name: Build
      ansible.builtin.set_stats:
        data:
          build: "42"
          count: 3
          ratio: 0.5
          nested: {list: [1, "x", true], none: null}
          token: "s3cret-token-value"
    - name: Add
      ansible.builtin.set_stats:
        data:
          later: yes
    - name: Per host
      ansible.builtin.set_stats:
        per_host: true
        data:
          mine: 1
`

// TestRunJobArtifacts: a job's set_stats data (per_host: false) comes back
// as its Result's Artifacts, typed as Ansible set them (integers stay
// integers), with secrets redacted; per-host data is not an artifact, and
// a run that set none has none.
func TestRunJobArtifacts(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	js := jobOn(s, jobDir(t, artifactsPlay, "-"))
	js.Redact = func(v string) string {
		if v == "s3cret-token-value" {
			return "[REDACTED]"
		}
		return v
	}
	res, err := r.RunJob(context.Background(), js)
	if err != nil {
		t.Fatalf("RunJob: %v", err)
	}
	if res.Outcome != OutcomeSucceeded {
		t.Fatalf("outcome %s: %v\n%s", res.Outcome, res.Err, res.OutputTail)
	}
	want := map[string]any{
		"build": "42", "count": int64(3), "ratio": 0.5, "later": true, "token": "[REDACTED]",
		"nested": map[string]any{"list": []any{int64(1), "x", true}, "none": nil},
	}
	if !reflect.DeepEqual(res.Artifacts, want) {
		t.Errorf("artifacts %#v\nwant %#v", res.Artifacts, want)
	}

	plain := jobOn(s, jobDir(t, "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n", "-"))
	res, err = r.RunJob(context.Background(), plain)
	if err != nil || res.Outcome != OutcomeSucceeded {
		t.Fatalf("plain run: %v %+v", err, res)
	}
	if res.Artifacts != nil {
		t.Errorf("a run without set_stats has artifacts %#v", res.Artifacts)
	}
}
