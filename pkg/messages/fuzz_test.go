package messages_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/internal/cases"
)

// FuzzDecode runs every decoder on arbitrary bytes, seeded with the golden
// and Python vectors. A decoder never panics; every error is IsInvalid; a
// message that decodes re-encodes to bytes that decode to the same message
// and re-encode to the same bytes. A partial message returned with an
// error encodes without panicking.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 30s ./messages/
func FuzzDecode(f *testing.F) {
	for _, dir := range []string{"golden", "python"} {
		paths, err := filepath.Glob(filepath.Join("testdata", dir, "*.msgpack"))
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0x80})
	f.Add([]byte{0xc1})
	f.Add([]byte{0x81, 0xa1, 'x', 0x91, 0x91, 0x91, 0x80})
	types := []string{"ProvisionerMessage", "AnsibleDeployMessage", "ProvisionerResult", "AnsibleDeployResult", "ProgressEvent"}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, typ := range types {
			msg, err := cases.DecodeAny(typ, data)
			if err != nil {
				if !messages.IsInvalid(err) {
					t.Fatalf("%s: error %T %v is not IsInvalid", typ, err, err)
				}
				if msg != nil {
					if _, err := messages.Encode(msg); err != nil && len(data) < messages.MaxMessageSize/2 {
						t.Fatalf("%s: encode partial message: %v", typ, err)
					}
				}
				continue
			}
			if msg == nil {
				t.Fatalf("%s: no message and no error", typ)
			}
			enc, err := messages.Encode(msg)
			if err != nil {
				t.Fatalf("%s: encode decoded message: %v", typ, err)
			}
			again, err := cases.DecodeAny(typ, enc)
			if err != nil {
				t.Fatalf("%s: decode re-encoded message: %v", typ, err)
			}
			if diff := diff(msg, again); diff != "" {
				t.Fatalf("%s: round trip changed the message (-first +second):\n%s", typ, diff)
			}
			enc2, err := messages.Encode(again)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, enc2) {
				t.Fatalf("%s: encoding is not canonical:\n%x\n%x", typ, enc, enc2)
			}
		}
	})
}
