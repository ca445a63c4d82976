package messages_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goIn runs the go command in this module alone (no workspace, no network:
// the module cache the test build filled is enough) and returns its output.
func goIn(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// TestProducerPullsOnlyMsgpack pins what a producer gets by importing the
// contract: its own module requires msgpack alone, the packages it builds
// are its own, msgpack's and the standard library's, and nothing of the services'
// stack (testcontainers, Vault, goose, Prometheus, Redis, Postgres, the
// rest of this repository) is even in its module graph.
func TestProducerPullsOnlyMsgpack(t *testing.T) {
	var mod struct {
		Require []struct{ Path string }
	}
	if err := json.Unmarshal([]byte(goIn(t, "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	var required []string
	for _, r := range mod.Require {
		required = append(required, r.Path)
	}
	slices.Sort(required)
	if want := []string{"github.com/vmihailenco/msgpack/v5", "github.com/vmihailenco/tagparser/v2"}; !slices.Equal(required, want) {
		t.Errorf("go.mod requires %v, want only %v (msgpack and its own dependency)", required, want)
	}

	const self = "github.com/autoprovisioner/autoprovisioner/pkg/messages"
	for _, pkg := range strings.Fields(goIn(t, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")) {
		if pkg != self && !strings.HasPrefix(pkg, self+"/") && !strings.HasPrefix(pkg, "github.com/vmihailenco/") {
			t.Errorf("package messages builds %s: only msgpack and the standard library are allowed", pkg)
		}
	}

	forbidden := []string{"testcontainers", "hashicorp/vault", "pressly/goose", "prometheus", "redis", "jackc/pgx",
		"github.com/autoprovisioner/", "go-cmp", "jsonschema"}
	for _, path := range moduleGraph(t) {
		for _, f := range forbidden {
			if strings.Contains(path, f) {
				t.Errorf("module graph of the contract holds %s", path)
			}
		}
	}
}

// moduleGraph returns every module of the contract's module graph, from its
// go.sum: go mod tidy records there the go.mod checksum of each module the
// graph loads, so the file is the whole graph without asking the module
// cache (a fresh cache holds only what builds needed, and `go list -m all`
// with GOPROXY=off fails on it) or the network.
func moduleGraph(t *testing.T) []string {
	t.Helper()
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	for _, line := range strings.Split(string(sum), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && strings.HasSuffix(f[1], "/go.mod") {
			mods = append(mods, f[0]+" "+strings.TrimSuffix(f[1], "/go.mod"))
		}
	}
	if !slices.ContainsFunc(mods, func(m string) bool { return strings.HasPrefix(m, "github.com/vmihailenco/msgpack/v5 ") }) {
		t.Fatalf("go.sum has no go.mod checksum of msgpack: not the contract's graph?\n%s", sum)
	}
	return mods
}
