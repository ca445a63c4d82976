package messages_test

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

var update = flag.Bool("update", false, "rewrite the golden vectors in testdata/golden from the Go values")

// golden is a checked-in vector and the Go value it holds, in the form the
// decoder returns (defaults filled, identifiers canonical).
type golden struct {
	file  string
	typ   string
	value any
}

func goldens() []golden {
	return []golden{
		{"provisioner_message.msgpack", "ProvisionerMessage", &messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10",
				CorrelationID: "agent-7/run-42",
				CreatedAt:     "2024-05-01T12:00:00.123Z",
			},
			ServerHandle:   "vps-101.example",
			ForceReinstall: true,
		}},
		{"ansible_deploy_message.msgpack", "AnsibleDeployMessage", &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "deploy-2024-05-01-0001",
				CorrelationID: "agent-7/run-43",
				CreatedAt:     "2024-05-01T12:00:00.000Z",
			},
			ProjectID:      "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			RepoFullName:   "acme/shop",
			Branch:         "release/2024.05",
			ServerIP:       "198.51.100.7",
			Port:           2222,
			Modules:        []string{"nginx", "php-fpm", "app"},
			GitHubTokenRef: "vault:secret/data/ci#github_token",
			SecretsRef:     "vault:secret/data/shop/prod",
		}},
		{"provisioner_result_succeeded.msgpack", "ProvisionerResult", &messages.ProvisionerResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10",
				RequestID:     "1714564800000-0",
				CorrelationID: "agent-7/run-42",
				Status:        messages.StatusSucceeded,
				Hosts:         map[string]messages.HostRecap{"vps-101.example": {Ok: 41, Changed: 17, Skipped: 5}},
				Playbook:      "provision.yml",
				StartedAt:     "2024-05-01T12:00:00.250Z",
				FinishedAt:    "2024-05-01T12:04:10.750Z",
				DurationMS:    250500,
				OutputTail:    "PLAY RECAP *****\nvps-101.example : ok=41 changed=17 unreachable=0 failed=0\n",
				Attempt:       1,
			},
			ServerHandle: "vps-101.example",
		}},
		{"provisioner_result_rejected.msgpack", "ProvisionerResult", &messages.ProvisionerResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "1714564800001-0",
				RequestID:     "1714564800001-0",
				Status:        messages.StatusRejected,
				Error: &messages.ErrorInfo{
					Kind:    messages.KindInvalidMessage,
					Message: "invalid message: server_handle: required",
					Fields:  []messages.FieldError{{Field: "server_handle", Message: "required"}},
				},
				StartedAt:  "2024-05-01T12:00:00.001Z",
				FinishedAt: "2024-05-01T12:00:00.001Z",
				Attempt:    1,
			},
		}},
		{"ansible_deploy_result_failed.msgpack", "AnsibleDeployResult", &messages.AnsibleDeployResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "deploy-2024-05-01-0001",
				RequestID:     "1714564800002-0",
				CorrelationID: "agent-7/run-43",
				Status:        messages.StatusFailed,
				Error:         &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "a task failed on 1 host"},
				Hosts: map[string]messages.HostRecap{
					"198.51.100.7": {Ok: 12, Changed: 3, Failed: 1, Skipped: 2, Rescued: 1, Ignored: 1},
				},
				FailedTask: &messages.FailedTask{
					Name: "Install packages", Host: "198.51.100.7", Play: "Deploy",
					Message: "No package matching 'php9' is available",
				},
				Playbook:   "deploy.yml",
				StartedAt:  "2024-05-01T12:00:00.000Z",
				FinishedAt: "2024-05-01T12:01:30.500Z",
				DurationMS: 90500,
				OutputTail: "TASK [Install packages]\nfatal: [198.51.100.7]: FAILED!\n",
				Attempt:    2,
			},
			ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			ServerIP:  "198.51.100.7",
			Port:      2222,
		}},
		{"ansible_deploy_result_unreachable.msgpack", "AnsibleDeployResult", &messages.AnsibleDeployResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "deploy-2024-05-01-0002",
				RequestID:     "1714564800003-0",
				Status:        messages.StatusUnreachable,
				Error:         &messages.ErrorInfo{Kind: messages.KindSSHUnreachable, Message: "dial tcp [2001:db8::1]:22: connection refused"},
				StartedAt:     "2024-05-01T12:00:00.000Z",
				FinishedAt:    "2024-05-01T12:00:10.000Z",
				DurationMS:    10000,
				Attempt:       3,
			},
			ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			ServerIP:  "2001:db8::1",
			Port:      22,
		}},
		{"progress_event_host_changed.msgpack", "ProgressEvent", &messages.ProgressEvent{
			SchemaVersion: 1,
			JobID:         "deploy-2024-05-01-0001",
			Seq:           12,
			Time:          "2024-05-01T12:00:42.125Z",
			Type:          messages.EventHostChanged,
			Play:          "Deploy",
			Task:          "Render nginx site",
			Host:          "198.51.100.7",
		}},
		{"progress_event_run_finished.msgpack", "ProgressEvent", &messages.ProgressEvent{
			SchemaVersion: 1,
			JobID:         "deploy-2024-05-01-0001",
			Seq:           40,
			Time:          "2024-05-01T12:01:30.500Z",
			Type:          messages.EventRunFinished,
			Message:       "1 host failed",
			Status:        messages.StatusFailed,
		}},
	}
}

// TestGolden pins the wire format: each checked-in vector decodes to its
// Go value, and Encode reproduces it byte for byte. `go test -run
// TestGolden -update` rewrites the vectors (review the diff!).
func TestGolden(t *testing.T) {
	for _, g := range goldens() {
		t.Run(g.file, func(t *testing.T) {
			path := filepath.Join("testdata", "golden", g.file)
			data, err := messages.Encode(g.value)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if *update {
				if err := os.WriteFile(path, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden vector (generate it with -update): %v", err)
			}
			if !bytes.Equal(data, want) {
				t.Errorf("Encode differs from %s:\ngot:\n%s\nwant:\n%s", path, hex.Dump(data), hex.Dump(want))
			}
			got, err := decodeAny(g.typ, want)
			if err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if diff := cmp.Diff(g.value, got); diff != "" {
				t.Errorf("decoded %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// pythonVector is a vector written by testdata/python/gen_vectors.py with
// the real Python msgpack, and what the Go decoder must make of it.
type pythonVector struct {
	file    string
	typ     string
	want    any
	wantErr []messages.FieldError // for a *DecodeError listing wrong-typed keys
}

func pythonVectors() []pythonVector {
	const jobID = "deploy-2024-05-01-0001"
	const projectID = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	return []pythonVector{
		{file: "provisioner_message.msgpack", typ: "ProvisionerMessage", want: &messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1, // absent on the wire
				JobID:         "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10",
				CorrelationID: "agent-7/run-42",
				CreatedAt:     "2024-05-01T12:00:00.123456+00:00",
			},
			ServerHandle: "vps-101.example",
			IsRecovery:   true,
		}},
		{file: "ansible_deploy_message.msgpack", typ: "AnsibleDeployMessage", want: &messages.AnsibleDeployMessage{
			RequestMeta:    messages.RequestMeta{SchemaVersion: 1},
			ProjectID:      "3f2504e0-4f89-41d3-9a0c-0305e82c3301", // upper case on the wire
			RepoFullName:   "octo-org/hello.world",
			Branch:         messages.DefaultBranch, // absent on the wire
			ServerIP:       "2001:db8::1",          // 2001:DB8:0:0:0:0:0:1 on the wire
			Port:           22,                     // uint16 on the wire
			Modules:        []string{"nginx", "php-fpm", "app_1"},
			GitHubTokenRef: "vault:secret/data/ci#github_token",
			SecretsRef:     "file:/run/secrets/app.env",
		}},
		{file: "ansible_deploy_message_old_spec.msgpack", typ: "AnsibleDeployMessage", want: &messages.AnsibleDeployMessage{
			RequestMeta:  messages.RequestMeta{SchemaVersion: 1, JobID: jobID},
			ProjectID:    projectID,
			RepoFullName: "acme/shop",
			Branch:       "release/2024.05",
			ServerIP:     "198.51.100.7",
			Port:         2222,
		}},
		{file: "ansible_deploy_result.msgpack", typ: "AnsibleDeployResult", want: &messages.AnsibleDeployResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         jobID,
				RequestID:     "1714564800000-0",
				Status:        messages.StatusFailed,
				Error:         &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "task failed on 1 host"},
				Hosts:         map[string]messages.HostRecap{"198.51.100.7": {Ok: 12, Changed: 3, Failed: 1}},
				FailedTask: &messages.FailedTask{
					Name: "Install packages", Host: "198.51.100.7", Play: "Deploy",
					Message: "No package matching 'php9' is available",
				},
				Playbook:   "deploy.yml",
				StartedAt:  "2024-05-01T12:00:00.000Z",
				FinishedAt: "2024-05-01T12:01:30.500Z",
				DurationMS: 90500,
				OutputTail: "TASK [Install packages]\nfatal: [198.51.100.7]: FAILED!\n",
				Attempt:    2,
			},
			ProjectID: projectID,
			ServerIP:  "198.51.100.7",
			Port:      2222,
		}},
		{file: "progress_event.msgpack", typ: "ProgressEvent", want: &messages.ProgressEvent{
			SchemaVersion: 1,
			JobID:         jobID,
			Seq:           17,
			Time:          "2024-05-01T12:01:29.875Z",
			Type:          messages.EventHostFailed,
			Play:          "Deploy",
			Task:          "Install packages",
			Host:          "198.51.100.7",
			Message:       "No package matching 'php9' is available",
		}},
		{file: "ansible_deploy_message_port_string.msgpack", typ: "AnsibleDeployMessage",
			want: &messages.AnsibleDeployMessage{ // what could be read, to echo in the rejection
				RequestMeta:  messages.RequestMeta{SchemaVersion: 1, JobID: "deploy-bad-port"},
				ProjectID:    projectID,
				RepoFullName: "acme/shop",
				Branch:       messages.DefaultBranch,
				ServerIP:     "198.51.100.7",
			},
			wantErr: []messages.FieldError{{Field: "port", Message: "must be an integer (got string)"}},
		},
	}
}

// TestPythonVectors decodes what Python producers write: other key orders,
// other integer widths, unknown keys, nil values, raw strings, no
// schema_version.
func TestPythonVectors(t *testing.T) {
	for _, v := range pythonVectors() {
		t.Run(v.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "python", v.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeAny(v.typ, data)
			if v.wantErr != nil {
				de, ok := err.(*messages.DecodeError)
				if !ok {
					t.Fatalf("error %T %v, want *DecodeError", err, err)
				}
				if diff := cmp.Diff(v.wantErr, de.Fields); diff != "" {
					t.Errorf("field errors (-want +got):\n%s", diff)
				}
				if !messages.IsInvalid(err) {
					t.Errorf("IsInvalid(%v) = false", err)
				}
			} else if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if diff := cmp.Diff(v.want, got); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
			if v.wantErr != nil {
				return
			}
			// What Go re-encodes reads back the same.
			again, err := messages.Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			if got2, err := decodeAny(v.typ, again); err != nil || !cmp.Equal(got, got2) {
				t.Errorf("re-encoded vector decodes to %+v, %v", got2, err)
			}
		})
	}
}

// TestPythonVectorsAreRecorded runs the generator with Debian's Python and
// checks that it writes exactly the checked-in vectors.
func TestPythonVectorsAreRecorded(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("/usr/bin/python3", filepath.Join("testdata", "python", "gen_vectors.py"), dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("/usr/bin/python3 gen_vectors.py (needs Debian's python3-msgpack): %v\n%s", err, out)
	}
	generated, err := filepath.Glob(filepath.Join(dir, "*.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := filepath.Glob(filepath.Join("testdata", "python", "*.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	names := func(paths []string) []string {
		out := make([]string, len(paths))
		for i, p := range paths {
			out[i] = filepath.Base(p)
		}
		slices.Sort(out)
		return out
	}
	if diff := cmp.Diff(names(recorded), names(generated)); diff != "" {
		t.Fatalf("vector files (-recorded +generated):\n%s", diff)
	}
	var tested []string
	for _, v := range pythonVectors() {
		tested = append(tested, v.file)
	}
	slices.Sort(tested)
	if diff := cmp.Diff(names(recorded), tested); diff != "" {
		t.Errorf("vectors without a test (-recorded +tested):\n%s", diff)
	}
	for _, p := range generated {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("testdata", "python", filepath.Base(p)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: Python now writes other bytes than recorded; rerun the generator and review", filepath.Base(p))
		}
	}
}
