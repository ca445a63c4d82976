package messages_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/internal/cases"
)

// BenchmarkDecodeAnsibleDeployMessage decodes, normalizes and validates
// the golden deploy request.
func BenchmarkDecodeAnsibleDeployMessage(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "golden", "ansible_deploy_message.msgpack"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := messages.DecodeAnsibleDeployMessage(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkEncodeAnsibleDeployResult encodes the golden failed deploy
// result (hosts, error, failed task).
func BenchmarkEncodeAnsibleDeployResult(b *testing.B) {
	var res *messages.AnsibleDeployResult
	for _, g := range cases.Goldens() {
		if g.File == "ansible_deploy_result_failed.msgpack" {
			res = g.Value.(*messages.AnsibleDeployResult)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := messages.Encode(res); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
