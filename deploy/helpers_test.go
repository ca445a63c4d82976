package deploy

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// root is the repository's top directory, relative to this package.
const root = ".."

// services are the system's services, as their folders under services/ name them.
var services = []string{"scheduler", "infra", "deployer"}

// binDir holds the service binaries TestMain builds (their --help lists the
// variables each reads; --check-config runs its validation).
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	for _, s := range services {
		if err := testenv.GoBuild(filepath.Join(dir, s), "../services/"+s, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// usageRow matches a variable's row of a service's --help table.
var usageRow = regexp.MustCompile(`^  ([A-Z][A-Z0-9_]*)\s+(\S+)`)

// serviceVars returns the variables a service reads, with their defaults,
// from its --help.
func serviceVars(t *testing.T, svc string) map[string]string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, svc), "--help").Output()
	if err != nil {
		t.Fatalf("%s --help: %v", svc, err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := usageRow.FindStringSubmatch(sc.Text()); m != nil && m[1] != "VARIABLE" {
			vars[m[1]] = m[2]
		}
	}
	if len(vars) < 5 || vars["ADMIN_ADDR"] == "" {
		t.Fatalf("%s --help lists no usable variable table:\n%s", svc, out)
	}
	return vars
}

// checkConfig runs a service's own configuration check in env and returns
// its output and whether it passed.
func checkConfig(t *testing.T, svc string, env map[string]string) (string, bool) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, svc), "--check-config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// adminPort returns the port of a host:port admin address.
func adminPort(t *testing.T, addr string) string {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("admin address %q has no port", addr)
	}
	return addr[i+1:]
}
