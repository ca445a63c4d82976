package messages_test

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestJobVarsRoundTrip: free-form variables keep their types through
// Encode and decode, in canonical bytes, whatever order and widths a
// producer wrote.
func TestJobVarsRoundTrip(t *testing.T) {
	raw := map[string]any{
		"project_id": "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F",
		"source":     map[string]any{"type": "playbook", "repository": "http://127.0.0.1/r.git", "paths": []string{"a.yml"}},
		"inventory": map[string]any{"type": "inline", "hosts": map[string]any{
			"h1": map[string]any{"ansible_host": "198.51.100.2", "n": uint8(7), "none": nil},
		}},
		"options": map[string]any{"extra_vars": map[string]any{
			"s": "{{ x }}", "i": int32(-3), "f": 1.5, "b": true, "l": []any{1, "two", nil}, "m": map[string]any{"k": []any{}},
		}},
	}
	data, err := msgpack.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	m, err := messages.DecodeAnsibleJobMessage(data)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	wantVars := messages.Vars{"s": "{{ x }}", "i": int64(-3), "f": 1.5, "b": true,
		"l": []any{int64(1), "two", nil}, "m": map[string]any{"k": []any{}}}
	if d := diff(wantVars, m.Options.ExtraVars); d != "" {
		t.Errorf("extra_vars:\n%s", d)
	}
	if d := diff(messages.Vars{"ansible_host": "198.51.100.2", "n": int64(7), "none": nil}, m.Inventory.Hosts["h1"]); d != "" {
		t.Errorf("host vars:\n%s", d)
	}
	if m.ProjectID != "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f" {
		t.Errorf("project_id %q not canonical", m.ProjectID)
	}
	enc, err := messages.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := messages.DecodeAnsibleJobMessage(enc)
	if err != nil {
		t.Fatal(err)
	}
	enc2, _ := messages.Encode(again)
	if string(enc) != string(enc2) {
		t.Error("re-encoding is not canonical")
	}
}

// TestJobVarsRefuseBinary: a variable holding msgpack binary or an
// extension (no Ansible type) is a field error naming its path.
func TestJobVarsRefuseBinary(t *testing.T) {
	raw := map[string]any{"project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		"options": map[string]any{"extra_vars": map[string]any{"x": []byte{1, 2}}}}
	data, err := msgpack.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	_, err = messages.DecodeAnsibleJobMessage(data)
	de, ok := err.(*messages.DecodeError)
	if !ok || len(de.Fields) != 1 || de.Fields[0].Field != "options.extra_vars[x]" {
		t.Fatalf("error %v, want a field error at options.extra_vars[x]", err)
	}
}

// TestJobNames: the stream, progress and cancel names of Ansible jobs.
func TestJobNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{messages.AnsibleJobQueue(""), "ansible:job:queue"},
		{messages.AnsibleJobQueue("gpu"), "ansible:job:queue:gpu"},
		{messages.ProgressStream(messages.JobKindJob, "j1"), "job:job:j1:events"},
		{messages.CancelKey(messages.JobKindJob, "j1"), "job:job:j1:cancel"},
		{messages.ResultsStream(messages.JobKindJob), "job:results"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
