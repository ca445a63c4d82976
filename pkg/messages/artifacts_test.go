package messages

import (
	"reflect"
	"strings"
	"testing"
)

// TestSetArtifacts: only names a workflow can pass on as extra vars are
// kept (the others are reported); artifacts over MaxArtifactsBytes are
// dropped whole; what SetArtifacts keeps validates and what it refuses
// would not.
func TestSetArtifacts(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", MaxArtifactsBytes)
	for _, tc := range []struct {
		name        string
		in          Vars
		want        Vars
		wantDropped []string
	}{
		{"none", nil, nil, nil},
		{"kept", Vars{"build": "42", "n": int64(3)}, Vars{"build": "42", "n": int64(3)}, nil},
		{"reserved and bad names", Vars{"ok": 1, "ansible_host": "x", "a-b": 2}, Vars{"ok": 1}, []string{"a-b", "ansible_host"}},
		{"too large", Vars{"blob": big, "small": 1}, nil, []string{"blob", "small"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &AnsibleJobResult{}
			dropped := r.SetArtifacts(tc.in)
			if !reflect.DeepEqual(r.Artifacts, tc.want) || !reflect.DeepEqual(dropped, tc.wantDropped) {
				t.Errorf("artifacts %v dropped %v, want %v %v", r.Artifacts, dropped, tc.want, tc.wantDropped)
			}
		})
	}
	r := &AnsibleJobResult{Outcome: Outcome{SchemaVersion: SchemaVersion, JobID: "job-1", RequestID: "1700000000000-0",
		Attempt: 1, Status: StatusSucceeded}}
	r.Artifacts = Vars{"ansible_user": "root"}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "artifacts[ansible_user]") {
		t.Errorf("reserved artifact name: %v", err)
	}
	r.Artifacts = Vars{"blob": big}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "artifacts") {
		t.Errorf("oversized artifacts: %v", err)
	}
	r.Artifacts = Vars{"build": "42"}
	if err := r.Validate(); err != nil {
		t.Errorf("good artifacts: %v", err)
	}
}
