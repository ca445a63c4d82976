package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDefaultEnvFile: without --env-file, autoprov reads the env file
// AUTOPROV_ENV_FILE names, or make run's run/dev/autoprov.env from the
// working directory; REDIS_URL_FILE in it is honoured. Redis refusing the
// credentials names the setting to fix and the file.
func TestDefaultEnvFile(t *testing.T) {
	// Not parallel: it changes the process's working directory, which the
	// other tests' relative paths (../../../../ansible, the builds) use.
	url, _ := redisDB(t)
	dir := t.TempDir()
	write := fileWriter(t, dir)
	urlFile := write("secrets/redis.url", url+"\n")
	good := write("run/dev/autoprov.env", "REDIS_URL_FILE="+urlFile+"\n")

	// The default file, from the working directory.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := run(t, nil, "status", "--json")
	_ = os.Chdir(wd)
	if code != 0 || !strings.Contains(stdout, "provisioner:queue") {
		t.Fatalf("status with run/dev/autoprov.env: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// --help names the file in use.
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	stdout, _, _ = run(t, nil, "--help")
	_ = os.Chdir(wd)
	if !strings.Contains(stdout, "run/dev/autoprov.env") {
		t.Errorf("--help does not name the env file in use:\n%s", stdout)
	}

	// AUTOPROV_ENV_FILE, from anywhere.
	if _, stderr, code := run(t, map[string]string{"AUTOPROV_ENV_FILE": good}, "status"); code != 0 {
		t.Fatalf("status with AUTOPROV_ENV_FILE: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, map[string]string{"AUTOPROV_ENV_FILE": filepath.Join(dir, "missing.env")}, "status"); code != ExitUsage ||
		!strings.Contains(stderr, "AUTOPROV_ENV_FILE") {
		t.Errorf("a missing AUTOPROV_ENV_FILE: exit %d, want %d naming it\n%s", code, ExitUsage, stderr)
	}

	// Credentials Redis refuses: the error says what to fix, and where.
	bad := write("bad.env", "REDIS_URL="+strings.Replace(url, "redis://", "redis://nobody:wrong@", 1)+"\n")
	_, stderr, code = run(t, map[string]string{"AUTOPROV_ENV_FILE": bad}, "status")
	for _, want := range []string{"WRONGPASS", "REDIS_URL", bad} {
		if code != ExitFailed || !strings.Contains(stderr, want) {
			t.Errorf("refused credentials: exit %d, stderr lacks %q:\n%s", code, want, stderr)
		}
	}
}
