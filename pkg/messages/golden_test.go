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

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/internal/cases"
)

var update = flag.Bool("update", false, "rewrite the golden vectors in testdata/golden from the Go values")

// TestGolden pins the wire format: each checked-in vector decodes to its
// Go value, and Encode reproduces it byte for byte. `go test -run
// TestGolden -update` rewrites the vectors (review the diff!).
func TestGolden(t *testing.T) {
	for _, g := range cases.Goldens() {
		t.Run(g.File, func(t *testing.T) {
			path := filepath.Join("testdata", "golden", g.File)
			data, err := messages.Encode(g.Value)
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
			got, err := cases.DecodeAny(g.Type, want)
			if err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if diff := diff(g.Value, got); diff != "" {
				t.Errorf("decoded %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestPythonVectors decodes what Python producers write: other key orders,
// other integer widths, unknown keys, nil values, raw strings, no
// schema_version.
func TestPythonVectors(t *testing.T) {
	for _, v := range cases.PythonVectors() {
		t.Run(v.File, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "python", v.File))
			if err != nil {
				t.Fatal(err)
			}
			got, err := cases.DecodeAny(v.Type, data)
			if v.WantErr != nil {
				de, ok := err.(*messages.DecodeError)
				if !ok {
					t.Fatalf("error %T %v, want *DecodeError", err, err)
				}
				if diff := diff(v.WantErr, de.Fields); diff != "" {
					t.Errorf("field errors (-want +got):\n%s", diff)
				}
				if !messages.IsInvalid(err) {
					t.Errorf("IsInvalid(%v) = false", err)
				}
			} else if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if diff := diff(v.Want, got); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
			if v.WantErr != nil {
				return
			}
			// What Go re-encodes reads back the same.
			again, err := messages.Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			if got2, err := cases.DecodeAny(v.Type, again); err != nil || diff(got, got2) != "" {
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
	if diff := diff(names(recorded), names(generated)); diff != "" {
		t.Fatalf("vector files (-recorded +generated):\n%s", diff)
	}
	var tested []string
	for _, v := range cases.PythonVectors() {
		tested = append(tested, v.File)
	}
	slices.Sort(tested)
	if diff := diff(names(recorded), tested); diff != "" {
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
