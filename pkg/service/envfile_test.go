package service

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEnvFile: the env file an operators' tool reads (flag, then
// AUTOPROV_ENV_FILE, then make run's file in the working directory), and
// how its variables sit under the environment's.
func TestEnvFile(t *testing.T) {
	dir := t.TempDir()
	named := filepath.Join(dir, "named.env")
	if err := os.WriteFile(named, []byte("REDIS_URL_FILE='/run/redis.url'\nAPI_ADDR=127.0.0.1:8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	wd, _ := os.Getwd()
	t.Cleanup(func() { _ = os.Chdir(wd) })
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, explicit, envVar, want string
		defaultFile, wantErr         bool
	}{
		{name: "none", want: ""},
		{name: "make run's file", defaultFile: true, want: DefaultEnvFile},
		{name: "AUTOPROV_ENV_FILE wins", defaultFile: true, envVar: named, want: named},
		{name: "the flag wins", envVar: "/nonexistent", explicit: named, want: named},
		{name: "a missing AUTOPROV_ENV_FILE", envVar: filepath.Join(dir, "missing.env"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.RemoveAll(filepath.Join(dir, "run"))
			if tc.defaultFile {
				if err := os.MkdirAll(filepath.Join(dir, "run", "dev"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, DefaultEnvFile), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := FindEnvFile(tc.explicit, env(map[string]string{EnvFileVar: tc.envVar}))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("FindEnvFile = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}

	file, err := ReadEnvFile(named)
	if err != nil {
		t.Fatal(err)
	}
	getenv := WithEnvFile(env(map[string]string{"REDIS_URL": "redis://env:6379/0", "API_ADDR": "127.0.0.1:9"}), file)
	for name, want := range map[string]string{
		"REDIS_URL":      "redis://env:6379/0", // the environment's
		"REDIS_URL_FILE": "",                   // hidden: the environment sets REDIS_URL
		"API_ADDR":       "127.0.0.1:9",        // the environment wins
	} {
		if got := getenv(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := WithEnvFile(env(nil), file)("REDIS_URL_FILE"); got != "/run/redis.url" {
		t.Errorf("REDIS_URL_FILE from the file = %q", got)
	}
}
