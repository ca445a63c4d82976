package messages_test

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestPeekString finds a top-level string without decoding the message,
// and says false for everything else.
func TestPeekString(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	req, err := messages.Encode(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: "job-7"},
		ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22,
		Modules: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
		ok   bool
	}{
		{"an encoded request", req, "job-7", true},
		{"after nested values", enc(map[string]any{"a": map[string]any{"job_id": "inner", "x": []any{1, []any{2}}}, "job_id": "outer"}), "outer", true},
		{"absent", enc(map[string]any{"project_id": "p"}), "", false},
		{"nil", enc(map[string]any{"job_id": nil}), "", false},
		{"not a string", enc(map[string]any{"job_id": 7}), "", false},
		{"not a map", enc([]any{"job_id", "x"}), "", false},
		{"a key that is no string", enc(map[int]string{1: "job_id"}), "", false},
		{"empty", nil, "", false},
		{"truncated before the key", req[:3], "", false},
		{"garbage", []byte{0xc1, 0xc1, 0xc1}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := messages.PeekString(tc.data, "job_id")
			if got != tc.want || ok != tc.ok {
				t.Errorf("PeekString = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// BenchmarkPeekJobID compares finding a request's job id with decoding the
// whole request, side by side.
func BenchmarkPeekJobID(b *testing.B) {
	data, err := messages.Encode(&messages.AnsibleDeployMessage{RequestMeta: messages.RequestMeta{JobID: "0193f0e4-8d4c-7b3a-9c1e-2f4a5b6c7d8e"},
		ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22,
		Modules: []string{"app", "nginx"}, Branch: "main"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("peek", func(b *testing.B) {
		for b.Loop() {
			if _, ok := messages.PeekString(data, "job_id"); !ok {
				b.Fatal("not found")
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := messages.DecodeAnsibleDeployMessage(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
