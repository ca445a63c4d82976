package messages_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// signatureVector is testdata/golden/signature_v1.json: a key, a stream,
// the data (a golden message) and the signature every producer must write.
type signatureVector struct {
	KeyID     string `json:"key_id"`
	KeyHex    string `json:"key_hex"`
	Stream    string `json:"stream"`
	DataFile  string `json:"data_file"`
	Signature string `json:"signature"`
}

func loadSignatureVector(t *testing.T) (signatureVector, []byte, []byte) {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden/signature_v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var v signatureVector
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	key, err := hex.DecodeString(v.KeyHex)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("testdata/golden", v.DataFile))
	if err != nil {
		t.Fatal(err)
	}
	return v, key, data
}

// TestSignatureGoldenVector: Go and Python (hmac, hashlib, base64 of the
// standard library, as any producer would write it) produce the checked-in
// signature of the checked-in message.
func TestSignatureGoldenVector(t *testing.T) {
	v, key, data := loadSignatureVector(t)
	sig, err := messages.Sign(v.KeyID, key, v.Stream, data)
	if err != nil {
		t.Fatal(err)
	}
	if sig != v.Signature {
		t.Fatalf("Go signs %s, the vector says %s", sig, v.Signature)
	}
	const py = `
import base64, hashlib, hmac, sys
key = bytes.fromhex(sys.argv[1]); stream = sys.argv[2].encode(); data = open(sys.argv[3], "rb").read()
mac = hmac.new(key, b"autoprov-sig-v1\x00" + stream + b"\x00" + data, hashlib.sha256).digest()
print("v1:" + sys.argv[4] + ":" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode())
`
	out, err := exec.Command("/usr/bin/python3", "-c", py, v.KeyHex, v.Stream,
		filepath.Join("testdata/golden", v.DataFile), v.KeyID).Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != v.Signature {
		t.Fatalf("Python signs %s, the vector says %s", got, v.Signature)
	}
}

func TestVerify(t *testing.T) {
	v, key, data := loadSignatureVector(t)
	other := bytes.Repeat([]byte{7}, 32)
	ver, err := messages.NewVerifier(
		messages.VerifierKey{ID: v.KeyID, Key: key, Streams: []string{messages.StreamProvisionerQueue}},
		messages.VerifierKey{ID: "deployer-1", Key: other, Streams: []string{messages.StreamAnsibleDeployQueue}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := ver.Verify(v.Stream, data, v.Signature); err != nil || id != v.KeyID {
		t.Fatalf("golden signature: %q %v", id, err)
	}
	forged, _ := messages.Sign("deployer-1", other, messages.StreamProvisionerQueue, data)
	wrongKey, _ := messages.Sign(v.KeyID, other, v.Stream, data)
	unknown, _ := messages.Sign("mallory", other, v.Stream, data)
	tampered := bytes.Clone(data)
	tampered[len(tampered)-1] ^= 1
	for name, tc := range map[string]struct {
		stream string
		data   []byte
		sig    string
		kind   error
	}{
		"unsigned":                     {v.Stream, data, "", messages.ErrUnsigned},
		"tampered data":                {v.Stream, tampered, v.Signature, messages.ErrBadSignature},
		"replayed on another stream":   {messages.StreamAnsibleDeployQueue, data, v.Signature, messages.ErrBadSignature},
		"key not allowed on stream":    {messages.StreamProvisionerQueue, data, forged, messages.ErrBadSignature},
		"known id, other key":          {v.Stream, data, wrongKey, messages.ErrBadSignature},
		"unknown key":                  {v.Stream, data, unknown, messages.ErrBadSignature},
		"malformed":                    {v.Stream, data, "v1:" + v.KeyID + ":short", messages.ErrBadSignature},
		"other version":                {v.Stream, data, strings.Replace(v.Signature, "v1:", "v2:", 1), messages.ErrBadSignature},
		"signature of the empty input": {v.Stream, nil, v.Signature, messages.ErrBadSignature},
	} {
		_, err := ver.Verify(tc.stream, tc.data, tc.sig)
		if !errors.Is(err, tc.kind) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.kind)
		}
		if err != nil && strings.Contains(err.Error(), hex.EncodeToString(key)) {
			t.Errorf("%s: the error shows the key", name)
		}
	}
	for _, bad := range [][]messages.VerifierKey{
		{{ID: "Bad ID", Key: key, Streams: []string{"s"}}},
		{{ID: "k", Key: key[:16], Streams: []string{"s"}}},
		{{ID: "k", Key: key}},
		{{ID: "k", Key: key, Streams: []string{"s"}}, {ID: "k", Key: key, Streams: []string{"s"}}},
	} {
		if _, err := messages.NewVerifier(bad...); err == nil {
			t.Errorf("verifier keys %+v accepted", bad)
		}
	}
	if _, err := messages.Sign("k", key[:31], "s", data); err == nil {
		t.Error("a 31-byte key signed")
	}
}
