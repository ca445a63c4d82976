// Package cases holds the test cases of the wire contract that tests in
// more than one module share: the golden vectors with the Go values they
// hold, the vectors Python writes, and the validation cases with the exact
// field errors. Package messages tests them; the contract module
// (pkg/messages/contract) checks the JSON Schemas against them. It is not
// linked into anything but tests.
package cases

import (
	"fmt"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Golden is a checked-in vector (testdata/golden) and the Go value it
// holds, in the form the decoder returns (defaults filled, identifiers
// canonical).
type Golden struct {
	File  string // name in pkg/messages/testdata/golden
	Type  string // message type, as DecodeAny names it
	Value any
}

// Goldens returns every golden vector.
func Goldens() []Golden {
	return append([]Golden{
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
		{"provisioner_message_playbooks.msgpack", "ProvisionerMessage", &messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "web-1.example-20240501T120000Z-3f9a",
				CreatedAt:     "2024-05-01T12:00:00.000Z",
			},
			ServerHandle: "web-1.example",
			Playbooks:    []string{"nginx.yml", "monitoring.yaml"},
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
		{"ansible_deploy_message_traced.msgpack", "AnsibleDeployMessage", &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "deploy-2024-05-01-0003",
				CreatedAt:     "2024-05-01T12:00:00.000Z",
				TraceContext: messages.TraceContext{
					Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
					Tracestate:  "congo=t61rcWkgMzE",
				},
			},
			ProjectID:    "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			RepoFullName: "acme/shop",
			Branch:       "main",
			ServerIP:     "198.51.100.7",
			Port:         22,
		}},
		// port is the application's port (the deploy playbook's port);
		// ssh_port the SSH port of an unregistered target.
		{"ansible_deploy_message_ssh_port.msgpack", "AnsibleDeployMessage", &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "deploy-2024-05-01-0004",
				CreatedAt:     "2024-05-01T12:00:00.000Z",
			},
			ProjectID:    "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			RepoFullName: "acme/shop",
			Branch:       "main",
			ServerIP:     "203.0.113.9",
			Port:         8080,
			SSHPort:      2222,
			Modules:      []string{"web"},
		}},
		{"provisioner_message_traced.msgpack", "ProvisionerMessage", &messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1,
				JobID:         "web-1.example-20240501T120000Z-7c21",
				CreatedAt:     "2024-05-01T12:00:00.000Z",
				TraceContext:  messages.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			},
			ServerHandle: "web-1.example",
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
		{"provisioner_result_partial.msgpack", "ProvisionerResult", &messages.ProvisionerResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "web-1.example-20240501T120000Z-3f9a",
				RequestID:     "1714564800004-0",
				Status:        messages.StatusFailed,
				Error:         &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "nginx.yml: failed on web-1.example in task \"Start nginx\""},
				Hosts:         map[string]messages.HostRecap{"web-1.example": {Ok: 4, Changed: 2, Failed: 1}},
				FailedTask: &messages.FailedTask{
					Name: "Start nginx", Host: "web-1.example", Play: "nginx",
					Message: "Job for nginx.service failed",
				},
				Playbook:   "nginx.yml",
				StartedAt:  "2024-05-01T12:00:00.500Z",
				FinishedAt: "2024-05-01T12:03:00.500Z",
				DurationMS: 180000,
				Attempt:    1,
			},
			ServerHandle: "web-1.example",
			Playbooks: []messages.PlaybookOutcome{
				{Playbook: "setup_server.yml", Status: messages.PlaybookSucceeded, DurationMS: 150000},
				{Playbook: "nginx.yml", Status: messages.PlaybookFailed, ErrorKind: messages.KindPlaybookFailed, DurationMS: 29000},
				{Playbook: "monitoring.yaml", Status: messages.PlaybookSkipped},
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
		{"provisioner_result_traced.msgpack", "ProvisionerResult", &messages.ProvisionerResult{
			Outcome: messages.Outcome{
				SchemaVersion: 1,
				JobID:         "web-1.example-20240501T120000Z-7c21",
				RequestID:     "1714564800005-0",
				Status:        messages.StatusSucceeded,
				Playbook:      "setup_server.yml",
				StartedAt:     "2024-05-01T12:00:00.100Z",
				FinishedAt:    "2024-05-01T12:02:00.100Z",
				DurationMS:    120000,
				Attempt:       1,
				TraceContext:  messages.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"},
			},
			ServerHandle: "web-1.example",
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
	}, jobGoldens()...)
}

// PythonVector is a vector written by testdata/python/gen_vectors.py with
// the real Python msgpack, and what the Go decoder must make of it.
type PythonVector struct {
	File    string // name in pkg/messages/testdata/python
	Type    string // message type, as DecodeAny names it
	Want    any
	WantErr []messages.FieldError // for a *DecodeError listing wrong-typed keys
}

// PythonVectors returns every vector Python writes.
func PythonVectors() []PythonVector {
	const jobID = "deploy-2024-05-01-0001"
	const projectID = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	return []PythonVector{
		{File: "provisioner_message.msgpack", Type: "ProvisionerMessage", Want: &messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{
				SchemaVersion: 1, // absent on the wire
				JobID:         "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10",
				CorrelationID: "agent-7/run-42",
				CreatedAt:     "2024-05-01T12:00:00.123456+00:00",
			},
			ServerHandle: "vps-101.example",
			IsRecovery:   true,
		}},
		{File: "ansible_deploy_message.msgpack", Type: "AnsibleDeployMessage", Want: &messages.AnsibleDeployMessage{
			RequestMeta:    messages.RequestMeta{SchemaVersion: 1},
			ProjectID:      "3f2504e0-4f89-41d3-9a0c-0305e82c3301", // upper case on the wire
			RepoFullName:   "octo-org/hello.world",
			Branch:         messages.DefaultBranch, // absent on the wire
			ServerIP:       "2001:db8::1",          // 2001:DB8:0:0:0:0:0:1 on the wire
			Port:           22,                     // uint16 on the wire; an old-text producer's SSH port still decodes (infra refuses it for a target whose SSH port is 22)
			Modules:        []string{"nginx", "php-fpm", "app_1"},
			GitHubTokenRef: "vault:secret/data/ci#github_token",
			SecretsRef:     "file:/run/secrets/app.env",
		}},
		{File: "ansible_deploy_message_old_spec.msgpack", Type: "AnsibleDeployMessage", Want: &messages.AnsibleDeployMessage{
			RequestMeta:  messages.RequestMeta{SchemaVersion: 1, JobID: jobID},
			ProjectID:    projectID,
			RepoFullName: "acme/shop",
			Branch:       "release/2024.05",
			ServerIP:     "198.51.100.7",
			Port:         2222,
		}},
		{File: "ansible_deploy_result.msgpack", Type: "AnsibleDeployResult", Want: &messages.AnsibleDeployResult{
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
		{File: "progress_event.msgpack", Type: "ProgressEvent", Want: &messages.ProgressEvent{
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
		{File: "ansible_deploy_message_port_string.msgpack", Type: "AnsibleDeployMessage",
			Want: &messages.AnsibleDeployMessage{ // what could be read, to echo in the rejection
				RequestMeta:  messages.RequestMeta{SchemaVersion: 1, JobID: "deploy-bad-port"},
				ProjectID:    projectID,
				RepoFullName: "acme/shop",
				Branch:       messages.DefaultBranch,
				ServerIP:     "198.51.100.7",
			},
			WantErr: []messages.FieldError{{Field: "port", Message: "must be an integer (got string)"}},
		},
	}
}

// Validation is a message value and the exact field errors Validate
// must report for it (none: the value is valid).
type Validation struct {
	Name string
	Msg  Validatable
	Want []messages.FieldError
	// SchemaDiffers says why the JSON Schema cannot give the same verdict
	// (empty: it must).
	SchemaDiffers string
}

// Validatable is a message value.
type Validatable interface{ Validate() error }

func fe(field, message string) messages.FieldError {
	return messages.FieldError{Field: field, Message: message}
}

const (
	msgRequired     = "required"
	msgID           = "must be 1 to 255 printable ASCII characters without spaces"
	msgTime         = "must be an RFC 3339 time in UTC, like 2024-05-01T12:00:00Z"
	msgServerHandle = "must match ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
	msgUUID         = "must be a UUID in canonical form (8-4-4-4-12 hex digits)"
	msgRepo         = "must be owner/repo: owner of 1-39 letters, digits or '-' not starting with '-', " +
		"repo of 1-100 letters, digits, '.', '_' or '-' other than '.' and '..'"
	msgIP        = "must be an IPv4 or IPv6 address literal without a zone"
	msgModule    = "must match ^[a-z0-9][a-z0-9_-]*$ and be at most 63 bytes"
	msgSecretRef = "must be a secret reference (vault:..., env:... or file:..., printable ASCII " +
		"without spaces), never a secret value"
	msgBranchChars = "must use only ASCII letters, digits and . _ / -"
	msgStatus      = "must be one of succeeded, failed, unreachable, rejected, cancelled"
	msgTraceparent = "must be a W3C traceparent like 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, in lower case"
	msgTracestate  = "must be printable ASCII (a W3C tracestate list)"
	// traceparent is the example of W3C Trace Context.
	traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msgPlaybook = "must be a file name in playbooks/ matching ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\\.ya?ml$"
)

// playbooks returns n distinct extra playbook names.
func playbooks(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("pb-%d.yml", i)
	}
	return names
}

func provisionerCases() []Validation {
	p := func(edit func(m *messages.ProvisionerMessage)) *messages.ProvisionerMessage {
		m := &messages.ProvisionerMessage{ServerHandle: "web-1"}
		edit(m)
		return m
	}
	same := func(*messages.ProvisionerMessage) {}
	return []Validation{
		{Name: "minimal", Msg: p(same)},
		{Name: "all keys", Msg: p(func(m *messages.ProvisionerMessage) {
			m.SchemaVersion = 1
			m.JobID = "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10"
			m.CorrelationID = "agent-7/run-42"
			m.CreatedAt = "2024-05-01T12:00:00.123Z"
			m.ForceReinstall = true
		})},
		{Name: "handle of every allowed character", Msg: p(func(m *messages.ProvisionerMessage) {
			m.ServerHandle = "Az09._:@-x"
		})},
		{Name: "handle of 128 characters", Msg: p(func(m *messages.ProvisionerMessage) {
			m.ServerHandle = strings.Repeat("h", 128)
		})},
		{Name: "recovery", Msg: p(func(m *messages.ProvisionerMessage) { m.IsRecovery = true })},
		{Name: "extra playbooks", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Playbooks = []string{"nginx.yml", "Z9_app-1.v2.yaml", "x.yml"}
		})},
		{Name: "recovery with extra playbooks", Msg: p(func(m *messages.ProvisionerMessage) {
			m.IsRecovery = true
			m.Playbooks = []string{"nginx.yml"}
		})},
		{Name: "32 extra playbooks", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = playbooks(32) })},
		{Name: "extra playbook name of 104 characters", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Playbooks = []string{strings.Repeat("p", 100) + ".yml"}
		})},
		{Name: "created_at with +00:00 and microseconds", Msg: p(func(m *messages.ProvisionerMessage) {
			m.CreatedAt = "2024-05-01T12:00:00.123456+00:00"
		})},
		{Name: "created_at without fraction", Msg: p(func(m *messages.ProvisionerMessage) {
			m.CreatedAt = "2024-05-01T12:00:00Z"
		})},
		{Name: "job_id of 255 characters", Msg: p(func(m *messages.ProvisionerMessage) {
			m.JobID = strings.Repeat("j", 255)
		})},

		{Name: "handle missing", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = "" }),
			Want: []messages.FieldError{fe("server_handle", msgRequired)}},
		{Name: "handle of 129 characters", Msg: p(func(m *messages.ProvisionerMessage) {
			m.ServerHandle = strings.Repeat("h", 129)
		}), Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "handle starting with a dash", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = "-web" }),
			Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "handle starting with a dot", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = ".web" }),
			Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "handle with a space", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = "web 1" }),
			Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "handle with a slash", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = "web/1" }),
			Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "handle not ASCII", Msg: p(func(m *messages.ProvisionerMessage) { m.ServerHandle = "wéb" }),
			Want: []messages.FieldError{fe("server_handle", msgServerHandle)}},
		{Name: "33 extra playbooks", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = playbooks(33) }),
			Want: []messages.FieldError{fe("playbooks", "must have at most 32 entries")}},
		{Name: "extra playbook with a path", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Playbooks = []string{"nginx.yml", "../../etc/evil.yml"}
		}), Want: []messages.FieldError{fe("playbooks[1]", msgPlaybook)}},
		{Name: "extra playbook in a subdirectory", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = []string{"roles/x.yml"} }),
			Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "extra playbook not YAML", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = []string{"run.sh"} }),
			Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "extra playbook hidden", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = []string{".x.yml"} }),
			Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "extra playbook as an option", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = []string{"-e.yml"} }),
			Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "extra playbook empty", Msg: p(func(m *messages.ProvisionerMessage) { m.Playbooks = []string{""} }),
			Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "extra playbook name of 105 characters", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Playbooks = []string{strings.Repeat("p", 101) + ".yml"}
		}), Want: []messages.FieldError{fe("playbooks[0]", msgPlaybook)}},
		{Name: "duplicate extra playbook", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Playbooks = []string{"a.yml", "b.yml", "a.yml"}
		}), Want: []messages.FieldError{fe("playbooks[2]", "duplicate of playbooks[0]")}},
		{Name: "reinstall and recovery", Msg: p(func(m *messages.ProvisionerMessage) {
			m.ForceReinstall, m.IsRecovery = true, true
		}), Want: []messages.FieldError{fe("is_recovery", "cannot be combined with force_reinstall")}},
		{Name: "schema_version too new", Msg: p(func(m *messages.ProvisionerMessage) { m.SchemaVersion = 2 }),
			Want: []messages.FieldError{fe("schema_version", "unsupported version 2; the newest supported is 1")}},
		{Name: "schema_version negative", Msg: p(func(m *messages.ProvisionerMessage) { m.SchemaVersion = -1 }),
			Want: []messages.FieldError{fe("schema_version", "must be a positive integer")}},
		{Name: "job_id with a space", Msg: p(func(m *messages.ProvisionerMessage) { m.JobID = "job 1" }),
			Want: []messages.FieldError{fe("job_id", msgID)}},
		{Name: "job_id of 256 characters", Msg: p(func(m *messages.ProvisionerMessage) { m.JobID = strings.Repeat("j", 256) }),
			Want: []messages.FieldError{fe("job_id", msgID)}},
		{Name: "job_id with a control character", Msg: p(func(m *messages.ProvisionerMessage) { m.JobID = "job\n1" }),
			Want: []messages.FieldError{fe("job_id", msgID)}},
		{Name: "correlation_id not ASCII", Msg: p(func(m *messages.ProvisionerMessage) { m.CorrelationID = "ünï" }),
			Want: []messages.FieldError{fe("correlation_id", msgID)}},
		{Name: "created_at with a space", Msg: p(func(m *messages.ProvisionerMessage) { m.CreatedAt = "2024-05-01 12:00:00Z" }),
			Want: []messages.FieldError{fe("created_at", msgTime)}},
		{Name: "created_at not UTC", Msg: p(func(m *messages.ProvisionerMessage) { m.CreatedAt = "2024-05-01T12:00:00+02:00" }),
			Want: []messages.FieldError{fe("created_at", msgTime)}},
		{Name: "created_at without offset", Msg: p(func(m *messages.ProvisionerMessage) { m.CreatedAt = "2024-05-01T12:00:00" }),
			Want: []messages.FieldError{fe("created_at", msgTime)}},
		{Name: "created_at month 13", Msg: p(func(m *messages.ProvisionerMessage) { m.CreatedAt = "2024-13-01T12:00:00Z" }),
			Want: []messages.FieldError{fe("created_at", msgTime)}},
		{Name: "created_at not a time", Msg: p(func(m *messages.ProvisionerMessage) { m.CreatedAt = "yesterday" }),
			Want: []messages.FieldError{fe("created_at", msgTime)}},
		{Name: "trace context", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = traceparent
			m.Tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
		})},
		{Name: "traceparent of a future version with more fields", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes"
		})},
		{Name: "tracestate of 512 bytes", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = traceparent
			m.Tracestate = "k=" + strings.Repeat("v", 510)
		})},
		{Name: "traceparent in upper case", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = strings.ToUpper(traceparent)
		}), Want: []messages.FieldError{fe("traceparent", msgTraceparent)}},
		{Name: "traceparent version ff", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = "ff" + traceparent[2:]
		}), Want: []messages.FieldError{fe("traceparent", msgTraceparent)}},
		{Name: "traceparent of version 00 with more fields", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = traceparent + "-x"
		}), Want: []messages.FieldError{fe("traceparent", msgTraceparent)}},
		{Name: "traceparent short span id", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01"
		}), Want: []messages.FieldError{fe("traceparent", msgTraceparent)}},
		{Name: "tracestate over 512 bytes", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Traceparent = traceparent
			m.Tracestate = "k=" + strings.Repeat("v", 511)
		}), Want: []messages.FieldError{fe("tracestate", "must be at most 512 bytes")}},
		{Name: "tracestate with a control character", Msg: p(func(m *messages.ProvisionerMessage) {
			m.Tracestate = "k=v\n"
		}), Want: []messages.FieldError{fe("tracestate", msgTracestate)}},
		{Name: "every error at once, in key order", Msg: &messages.ProvisionerMessage{
			RequestMeta:    messages.RequestMeta{SchemaVersion: 3, JobID: " ", CorrelationID: " ", CreatedAt: "now"},
			ForceReinstall: true, IsRecovery: true,
		}, Want: []messages.FieldError{
			fe("schema_version", "unsupported version 3; the newest supported is 1"),
			fe("job_id", msgID),
			fe("correlation_id", msgID),
			fe("created_at", msgTime),
			fe("server_handle", msgRequired),
			fe("is_recovery", "cannot be combined with force_reinstall"),
		}},
	}
}

func deployCases() []Validation {
	d := func(edit func(m *messages.AnsibleDeployMessage)) *messages.AnsibleDeployMessage {
		m := &messages.AnsibleDeployMessage{
			ProjectID:    "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			RepoFullName: "acme/shop",
			ServerIP:     "198.51.100.7",
			Port:         8080,
		}
		edit(m)
		return m
	}
	valid := func(name string, edit func(m *messages.AnsibleDeployMessage)) Validation {
		return Validation{Name: name, Msg: d(edit)}
	}
	invalid := func(name string, edit func(m *messages.AnsibleDeployMessage), field, message string) Validation {
		return Validation{Name: name, Msg: d(edit), Want: []messages.FieldError{fe(field, message)}}
	}
	branch := func(b string) func(m *messages.AnsibleDeployMessage) {
		return func(m *messages.AnsibleDeployMessage) { m.Branch = b }
	}
	modules := func(names ...string) func(m *messages.AnsibleDeployMessage) {
		return func(m *messages.AnsibleDeployMessage) { m.Modules = names }
	}
	many := func(n int) []string {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("mod-%d", i)
		}
		return names
	}
	cases := []Validation{
		valid("minimal", func(*messages.AnsibleDeployMessage) {}),
		valid("all keys", func(m *messages.AnsibleDeployMessage) {
			m.JobID = "deploy-1"
			m.CorrelationID = "c-1"
			m.CreatedAt = "2024-05-01T12:00:00.000Z"
			m.Branch = "feature/new-checkout"
			m.Modules = []string{"nginx", "php-fpm", "app_1", "9lives"}
			m.GitHubTokenRef = "vault:secret/data/ci#github_token"
			m.SecretsRef = "env:SHOP_SECRETS"
		}),
		valid("upper-case UUID", func(m *messages.AnsibleDeployMessage) { m.ProjectID = "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F" }),
		valid("repo with dots", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "octo-org/hello.world" }),
		valid("repo named ...", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/..." }),
		valid("repo named .github", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/.github" }),
		valid("owner of 39 characters", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = strings.Repeat("o", 39) + "/r" }),
		valid("repo of 100 characters", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "o/" + strings.Repeat("r", 100) }),
		valid("IPv6", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "2001:db8::1" }),
		valid("IPv6 not canonical", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "2001:DB8:0:0:0:0:0:1" }),
		valid("IPv4-mapped IPv6", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "::ffff:198.51.100.7" }),
		valid("port 1", func(m *messages.AnsibleDeployMessage) { m.Port = 1 }),
		valid("port 65535", func(m *messages.AnsibleDeployMessage) { m.Port = 65535 }),
		// port is the application's port, whatever number it is: the rule
		// that it is not the target's SSH port needs the target (infra).
		valid("port 22", func(m *messages.AnsibleDeployMessage) { m.Port = 22 }),
		valid("ssh_port", func(m *messages.AnsibleDeployMessage) { m.SSHPort = 2222 }),
		valid("ssh_port 1", func(m *messages.AnsibleDeployMessage) { m.SSHPort = 1 }),
		valid("ssh_port 65535", func(m *messages.AnsibleDeployMessage) { m.SSHPort = 65535 }),
		valid("timeout_seconds 1", func(m *messages.AnsibleDeployMessage) { m.TimeoutSeconds = 1 }),
		valid("timeout_seconds a day", func(m *messages.AnsibleDeployMessage) { m.TimeoutSeconds = 86400 }),
		valid("branch with a slash and dots", branch("release/2024.05")),
		valid("branch of every allowed character", branch("Az09._/-x")),
		valid("branch of 200 bytes", branch(strings.Repeat("b", 200))),
		valid("branch with .lock inside", branch("a.locked")),
		valid("module of 63 characters", modules(strings.Repeat("m", 63))),
		valid("64 modules", modules(many(64)...)),
		valid("file reference", func(m *messages.AnsibleDeployMessage) { m.SecretsRef = "file:/run/secrets/app.env" }),
		valid("reference of 512 bytes", func(m *messages.AnsibleDeployMessage) {
			m.GitHubTokenRef = "env:" + strings.Repeat("T", 508)
		}),

		invalid("project_id missing", func(m *messages.AnsibleDeployMessage) { m.ProjectID = "" }, "project_id", msgRequired),
		invalid("project_id not a UUID", func(m *messages.AnsibleDeployMessage) { m.ProjectID = "shop" }, "project_id", msgUUID),
		invalid("project_id without hyphens", func(m *messages.AnsibleDeployMessage) {
			m.ProjectID = "9b2f4c6e1d3a4e5b8c7d0a1b2c3d4e5f"
		}, "project_id", msgUUID),
		invalid("project_id in braces", func(m *messages.AnsibleDeployMessage) {
			m.ProjectID = "{9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f}"
		}, "project_id", msgUUID),
		invalid("project_id as URN", func(m *messages.AnsibleDeployMessage) {
			m.ProjectID = "urn:uuid:9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
		}, "project_id", msgUUID),
		invalid("repo missing", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "" }, "repo_full_name", msgRequired),
		invalid("repo without owner", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "shop" }, "repo_full_name", msgRepo),
		invalid("repo with two slashes", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/shop/x" }, "repo_full_name", msgRepo),
		invalid("owner starting with a dash", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "-acme/shop" }, "repo_full_name", msgRepo),
		invalid("owner with an underscore", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "ac_me/shop" }, "repo_full_name", msgRepo),
		invalid("owner of 40 characters", func(m *messages.AnsibleDeployMessage) {
			m.RepoFullName = strings.Repeat("o", 40) + "/r"
		}, "repo_full_name", msgRepo),
		invalid("repo of 101 characters", func(m *messages.AnsibleDeployMessage) {
			m.RepoFullName = "o/" + strings.Repeat("r", 101)
		}, "repo_full_name", msgRepo),
		invalid("repo named .", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/." }, "repo_full_name", msgRepo),
		invalid("repo named ..", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/.." }, "repo_full_name", msgRepo),
		invalid("repo empty", func(m *messages.AnsibleDeployMessage) { m.RepoFullName = "acme/" }, "repo_full_name", msgRepo),
		invalid("branch with ..", branch("a..b"), "branch", `must not contain ".."`),
		invalid("branch starting with -", branch("-b"), "branch", "must not start with '-'"),
		invalid("branch starting with /", branch("/b"), "branch", "must not start with '/'"),
		invalid("branch ending with /", branch("b/"), "branch", "must not end with '/'"),
		invalid("branch ending with .", branch("b."), "branch", "must not end with '.'"),
		invalid("branch ending with .lock", branch("b.lock"), "branch", `no part between slashes may end with ".lock"`),
		invalid("branch part ending with .lock", branch("a.lock/b"), "branch", `no part between slashes may end with ".lock"`),
		invalid("branch starting with .", branch(".b"), "branch", "no part between slashes may start with '.'"),
		invalid("branch part starting with .", branch("a/.b"), "branch", "no part between slashes may start with '.'"),
		invalid("branch with //", branch("a//b"), "branch", `must not contain "//"`),
		invalid("branch with @{", branch("a@{1}"), "branch", msgBranchChars),
		invalid("branch @", branch("@"), "branch", msgBranchChars),
		invalid("branch with @", branch("user@host"), "branch", msgBranchChars),
		invalid("branch with +", branch("a+b"), "branch", msgBranchChars),
		invalid("branch not ASCII", branch("fonctionnalité"), "branch", msgBranchChars),
		invalid("branch with a space", branch("a b"), "branch", msgBranchChars),
		invalid("branch with a tab", branch("a\tb"), "branch", msgBranchChars),
		invalid("branch with DEL", branch("a\x7fb"), "branch", msgBranchChars),
		invalid("branch of 201 bytes", branch(strings.Repeat("b", 201)), "branch", "must be at most 200 bytes"),
		invalid("server_ip missing", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "" }, "server_ip", msgRequired),
		invalid("server_ip a host name", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "example.com" }, "server_ip", msgIP),
		invalid("server_ip out of range", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "192.0.2.256" }, "server_ip", msgIP),
		invalid("server_ip with leading zeros", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "192.0.2.01" }, "server_ip", msgIP),
		invalid("server_ip with a zone", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "fe80::1%eth0" }, "server_ip", msgIP),
		invalid("server_ip with a space", func(m *messages.AnsibleDeployMessage) { m.ServerIP = " 192.0.2.1" }, "server_ip", msgIP),
		invalid("server_ip with a port", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "192.0.2.1:22" }, "server_ip", msgIP),
		invalid("server_ip a CIDR", func(m *messages.AnsibleDeployMessage) { m.ServerIP = "192.0.2.0/24" }, "server_ip", msgIP),
		invalid("port missing", func(m *messages.AnsibleDeployMessage) { m.Port = 0 }, "port", msgRequired),
		invalid("port negative", func(m *messages.AnsibleDeployMessage) { m.Port = -22 }, "port", "must be between 1 and 65535"),
		invalid("port 65536", func(m *messages.AnsibleDeployMessage) { m.Port = 65536 }, "port", "must be between 1 and 65535"),
		invalid("ssh_port negative", func(m *messages.AnsibleDeployMessage) { m.SSHPort = -22 }, "ssh_port", "must be between 1 and 65535"),
		invalid("ssh_port 65536", func(m *messages.AnsibleDeployMessage) { m.SSHPort = 65536 }, "ssh_port", "must be between 1 and 65535"),
		invalid("timeout_seconds negative", func(m *messages.AnsibleDeployMessage) { m.TimeoutSeconds = -1 }, "timeout_seconds", "must be between 1 and 86400 (seconds)"),
		invalid("timeout_seconds over a day", func(m *messages.AnsibleDeployMessage) { m.TimeoutSeconds = 86401 }, "timeout_seconds", "must be between 1 and 86400 (seconds)"),
		invalid("module upper case", modules("nginx", "PHP"), "modules[1]", msgModule),
		invalid("module starting with -", modules("-x"), "modules[0]", msgModule),
		invalid("module starting with _", modules("_x"), "modules[0]", msgModule),
		invalid("module with a space", modules("a b"), "modules[0]", msgModule),
		invalid("module empty", modules(""), "modules[0]", msgModule),
		invalid("module of 64 characters", modules(strings.Repeat("m", 64)), "modules[0]", msgModule),
		invalid("65 modules", modules(many(65)...), "modules", "must have at most 64 entries"),
		invalid("duplicate module", modules("a", "b", "a"), "modules[2]", "duplicate of modules[0]"),
		invalid("token value instead of a reference", func(m *messages.AnsibleDeployMessage) {
			m.GitHubTokenRef = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
		}, "github_token_ref", msgSecretRef),
		invalid("reference without a name", func(m *messages.AnsibleDeployMessage) { m.SecretsRef = "vault:" }, "secrets_ref", msgSecretRef),
		invalid("reference of an unknown scheme", func(m *messages.AnsibleDeployMessage) { m.SecretsRef = "s3:bucket/key" }, "secrets_ref", msgSecretRef),
		invalid("reference scheme in upper case", func(m *messages.AnsibleDeployMessage) { m.SecretsRef = "VAULT:x" }, "secrets_ref", msgSecretRef),
		invalid("reference with a space", func(m *messages.AnsibleDeployMessage) { m.SecretsRef = "file:/a b" }, "secrets_ref", msgSecretRef),
		invalid("reference of 513 bytes", func(m *messages.AnsibleDeployMessage) {
			m.SecretsRef = "env:" + strings.Repeat("T", 509)
		}, "secrets_ref", "must be at most 512 bytes"),
		{Name: "every error at once, in key order", Msg: &messages.AnsibleDeployMessage{
			RequestMeta:    messages.RequestMeta{SchemaVersion: 2},
			Branch:         "a..b",
			Port:           70000,
			SSHPort:        -1,
			Modules:        []string{"A", "b", "b"},
			GitHubTokenRef: "secret",
			SecretsRef:     "also-secret",
		}, Want: []messages.FieldError{
			fe("schema_version", "unsupported version 2; the newest supported is 1"),
			fe("project_id", msgRequired),
			fe("repo_full_name", msgRequired),
			fe("branch", `must not contain ".."`),
			fe("server_ip", msgRequired),
			fe("port", "must be between 1 and 65535"),
			fe("ssh_port", "must be between 1 and 65535"),
			fe("modules[0]", msgModule),
			fe("modules[2]", "duplicate of modules[1]"),
			fe("github_token_ref", msgSecretRef),
			fe("secrets_ref", msgSecretRef),
		}},
	}
	for _, bad := range []string{"a~b", "a^b", "a:b", "a?b", "a*b", "a[b", `a\b`, "a\x00b"} {
		cases = append(cases, invalid("branch "+strings.ReplaceAll(bad, "\x00", `\x00`), branch(bad), "branch", msgBranchChars))
	}
	return cases
}

func provisionerResultCases() []Validation {
	r := func(edit func(r *messages.ProvisionerResult)) *messages.ProvisionerResult {
		res := &messages.ProvisionerResult{Outcome: messages.Outcome{
			JobID: "job-1", RequestID: "1714564800000-0", Status: messages.StatusSucceeded,
		}}
		edit(res)
		return res
	}
	valid := func(name string, edit func(r *messages.ProvisionerResult)) Validation {
		return Validation{Name: name, Msg: r(edit)}
	}
	invalid := func(name string, edit func(r *messages.ProvisionerResult), want ...messages.FieldError) Validation {
		return Validation{Name: name, Msg: r(edit), Want: want}
	}
	failed := func(r *messages.ProvisionerResult) {
		r.Status = messages.StatusFailed
		r.Error = &messages.ErrorInfo{Kind: messages.KindPlaybookFailed, Message: "a task failed"}
	}
	return []Validation{
		valid("minimal success", func(*messages.ProvisionerResult) {}),
		valid("failure with every key", func(r *messages.ProvisionerResult) {
			failed(r)
			r.SchemaVersion = 1
			r.CorrelationID = "c-1"
			r.ServerHandle = "web-1"
			r.Hosts = map[string]messages.HostRecap{"web-1": {Ok: 3, Failed: 1}}
			r.FailedTask = &messages.FailedTask{Name: "t", Host: "web-1", Play: "p", Message: "m"}
			r.Playbook = "provision.yml"
			r.StartedAt = "2024-05-01T12:00:00.000Z"
			r.FinishedAt = "2024-05-01T12:00:01.000Z"
			r.DurationMS = 1000
			r.OutputTail = "fatal"
			r.Attempt = 2
		}),
		valid("rejected with fields", func(r *messages.ProvisionerResult) {
			r.Status = messages.StatusRejected
			r.Error = &messages.ErrorInfo{Kind: messages.KindInvalidMessage, Fields: []messages.FieldError{fe("server_handle", msgRequired)}}
			r.ServerHandle = "not a handle" // echoed as received
		}),
		valid("partial success of the playbooks", func(r *messages.ProvisionerResult) {
			failed(r)
			r.Playbooks = []messages.PlaybookOutcome{
				{Playbook: "setup_server.yml", Status: messages.PlaybookSucceeded, DurationMS: 1000},
				{Playbook: "nginx.yml", Status: messages.PlaybookFailed, ErrorKind: messages.KindPlaybookFailed, DurationMS: 10},
				{Playbook: "app.yml", Status: messages.PlaybookSkipped},
			}
		}),
		invalid("playbook outcome without name and status", func(r *messages.ProvisionerResult) {
			r.Playbooks = []messages.PlaybookOutcome{{Playbook: "a.yml", Status: messages.PlaybookSucceeded}, {}}
		}, fe("playbooks[1].playbook", msgRequired), fe("playbooks[1].status", msgRequired)),
		invalid("playbook outcome with a bad status, kind and duration", func(r *messages.ProvisionerResult) {
			r.Playbooks = []messages.PlaybookOutcome{{Playbook: "a.yml", Status: "rejected", ErrorKind: "Bad", DurationMS: -1}}
		}, fe("playbooks[0].status", "must be one of succeeded, failed, unreachable, cancelled, skipped"),
			fe("playbooks[0].error_kind", "must match ^[a-z][a-z0-9_]{0,63}$"),
			fe("playbooks[0].duration_ms", "must not be negative")),
		valid("unknown but well-formed error kind", func(r *messages.ProvisionerResult) {
			r.Status = messages.StatusFailed
			r.Error = &messages.ErrorInfo{Kind: "quota_exceeded"}
		}),

		invalid("job_id missing", func(r *messages.ProvisionerResult) { r.JobID = "" }, fe("job_id", msgRequired)),
		invalid("request_id missing", func(r *messages.ProvisionerResult) { r.RequestID = "" }, fe("request_id", msgRequired)),
		invalid("request_id not an entry id", func(r *messages.ProvisionerResult) { r.RequestID = "job-1" },
			fe("request_id", "must be a stream entry id like 1700000000000-0")),
		invalid("status missing", func(r *messages.ProvisionerResult) { r.Status = "" }, fe("status", msgRequired)),
		invalid("status unknown", func(r *messages.ProvisionerResult) { r.Status = "done" }, fe("status", msgStatus)),
		invalid("error on success", func(r *messages.ProvisionerResult) { r.Error = &messages.ErrorInfo{Kind: messages.KindInternal} },
			fe("error", "must be absent when status is succeeded")),
		invalid("failure without error", func(r *messages.ProvisionerResult) { r.Status = messages.StatusUnreachable },
			fe("error", "required when status is unreachable")),
		invalid("error without kind", func(r *messages.ProvisionerResult) {
			failed(r)
			r.Error.Kind = ""
		}, fe("error.kind", msgRequired)),
		invalid("error kind malformed", func(r *messages.ProvisionerResult) {
			failed(r)
			r.Error.Kind = "Playbook-Failed"
		}, fe("error.kind", "must match ^[a-z][a-z0-9_]{0,63}$")),
		invalid("field error without field", func(r *messages.ProvisionerResult) {
			r.Status = messages.StatusRejected
			r.Error = &messages.ErrorInfo{Kind: messages.KindInvalidMessage, Fields: []messages.FieldError{fe("port", "x"), fe("", "y")}}
		}, fe("error.fields[1].field", msgRequired)),
		invalid("negative host counts", func(r *messages.ProvisionerResult) {
			r.Hosts = map[string]messages.HostRecap{"b": {Skipped: -1}, "a": {Ok: -1, Ignored: -2}}
		}, fe("hosts[a].ok", "must not be negative"), fe("hosts[a].ignored", "must not be negative"),
			fe("hosts[b].skipped", "must not be negative")),
		invalid("empty host name", func(r *messages.ProvisionerResult) {
			r.Hosts = map[string]messages.HostRecap{"": {Ok: 1}}
		}, fe("hosts", "host names must not be empty")),
		invalid("started_at malformed", func(r *messages.ProvisionerResult) { r.StartedAt = "12:00" }, fe("started_at", msgTime)),
		invalid("finished_at not UTC", func(r *messages.ProvisionerResult) { r.FinishedAt = "2024-05-01T12:00:00-01:00" },
			fe("finished_at", msgTime)),
		invalid("duration negative", func(r *messages.ProvisionerResult) { r.DurationMS = -1 }, fe("duration_ms", "must not be negative")),
		invalid("attempt negative", func(r *messages.ProvisionerResult) { r.Attempt = -1 }, fe("attempt", "must not be negative")),
		valid("trace context of the job", func(r *messages.ProvisionerResult) {
			r.Traceparent = traceparent
			r.Tracestate = "rojo=00f067aa0ba902b7"
		}),
		invalid("traceparent malformed", func(r *messages.ProvisionerResult) { r.Traceparent = "00-1-2-01" },
			fe("traceparent", msgTraceparent)),
		invalid("schema_version too new", func(r *messages.ProvisionerResult) { r.SchemaVersion = 9 },
			fe("schema_version", "unsupported version 9; the newest supported is 1")),
	}
}

func deployResultCases() []Validation {
	r := func(port int) *messages.AnsibleDeployResult {
		return &messages.AnsibleDeployResult{
			Outcome: messages.Outcome{JobID: "job-1", RequestID: "1-0", Status: messages.StatusCancelled,
				Error: &messages.ErrorInfo{Kind: messages.KindCancelled}},
			ProjectID: "not-validated", ServerIP: "not-validated", Port: port,
		}
	}
	return []Validation{
		{Name: "echoed identifiers are not validated", Msg: r(22)},
		{Name: "port 0 (the request had none)", Msg: r(0)},
		{Name: "port out of range", Msg: r(65536), Want: []messages.FieldError{fe("port", "must be between 0 and 65535")}},
		{Name: "port negative", Msg: r(-1), Want: []messages.FieldError{fe("port", "must be between 0 and 65535")}},
	}
}

func progressCases() []Validation {
	e := func(edit func(e *messages.ProgressEvent)) *messages.ProgressEvent {
		ev := &messages.ProgressEvent{JobID: "job-1", Seq: 1, Time: "2024-05-01T12:00:00.000Z", Type: messages.EventRunStarted}
		edit(ev)
		return ev
	}
	valid := func(name string, edit func(e *messages.ProgressEvent)) Validation {
		return Validation{Name: name, Msg: e(edit)}
	}
	invalid := func(name string, edit func(e *messages.ProgressEvent), want ...messages.FieldError) Validation {
		return Validation{Name: name, Msg: e(edit), Want: want}
	}
	return []Validation{
		valid("run_started", func(*messages.ProgressEvent) {}),
		valid("task_started", func(e *messages.ProgressEvent) {
			e.Seq, e.Type, e.Play, e.Task = 3, messages.EventTaskStarted, "Deploy", "Install packages"
		}),
		valid("host_changed", func(e *messages.ProgressEvent) {
			e.Seq, e.Type, e.Host, e.Task = 4, messages.EventHostChanged, "web-1", "Install packages"
		}),
		valid("run_finished", func(e *messages.ProgressEvent) {
			e.Seq, e.Type, e.Status, e.Message = 9, messages.EventRunFinished, messages.StatusFailed, "1 host failed"
		}),

		invalid("job_id missing", func(e *messages.ProgressEvent) { e.JobID = "" }, fe("job_id", msgRequired)),
		invalid("seq 0", func(e *messages.ProgressEvent) { e.Seq = 0 }, fe("seq", "must be at least 1")),
		invalid("time missing", func(e *messages.ProgressEvent) { e.Time = "" }, fe("time", msgRequired)),
		invalid("time malformed", func(e *messages.ProgressEvent) { e.Time = "2024-05-01" }, fe("time", msgTime)),
		invalid("type missing", func(e *messages.ProgressEvent) { e.Type = "" }, fe("type", msgRequired)),
		invalid("type unknown", func(e *messages.ProgressEvent) { e.Type = "host_rescued" }, fe("type",
			"must be one of run_started, play_started, task_started, host_ok, host_changed, host_failed, "+
				"host_unreachable, host_skipped, run_finished")),
		invalid("host event without host", func(e *messages.ProgressEvent) { e.Type = messages.EventHostFailed },
			fe("host", "required for host_failed events")),
		invalid("run_finished without status", func(e *messages.ProgressEvent) { e.Type = messages.EventRunFinished },
			fe("status", "required for run_finished events")),
		invalid("run_finished with an unknown status", func(e *messages.ProgressEvent) {
			e.Type, e.Status = messages.EventRunFinished, "ok"
		}, fe("status", msgStatus)),
		invalid("status on another event", func(e *messages.ProgressEvent) { e.Status = messages.StatusSucceeded },
			fe("status", "only allowed on run_finished events")),
	}
}

// Validations returns the validation cases by message type (as DecodeAny
// names it).
func Validations() map[string][]Validation {
	return map[string][]Validation{
		"ProvisionerMessage":   provisionerCases(),
		"AnsibleDeployMessage": deployCases(),
		"ProvisionerResult":    provisionerResultCases(),
		"AnsibleDeployResult":  deployResultCases(),
		"ProgressEvent":        progressCases(),
		"AnsibleJobMessage":    jobCases(),
		"AnsibleJobResult":     jobResultCases(),
	}
}

// DecodeAny decodes data with the decoder of the message type named typ.
func DecodeAny(typ string, data []byte) (any, error) {
	switch typ {
	case "ProvisionerMessage":
		return asAny(messages.DecodeProvisionerMessage(data))
	case "AnsibleDeployMessage":
		return asAny(messages.DecodeAnsibleDeployMessage(data))
	case "ProvisionerResult":
		return asAny(messages.DecodeProvisionerResult(data))
	case "AnsibleDeployResult":
		return asAny(messages.DecodeAnsibleDeployResult(data))
	case "ProgressEvent":
		return asAny(messages.DecodeProgressEvent(data))
	case "AnsibleJobMessage":
		return asAny(messages.DecodeAnsibleJobMessage(data))
	case "AnsibleJobResult":
		return asAny(messages.DecodeAnsibleJobResult(data))
	}
	panic("unknown message type " + typ)
}

// asAny returns m as an interface that is nil when m is.
func asAny[T any](m *T, err error) (any, error) {
	if m == nil {
		return nil, err
	}
	return m, err
}
