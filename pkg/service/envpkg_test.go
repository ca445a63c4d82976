package service

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWithEnvPackage(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("staging/common.env", "LOG_LEVEL=debug\nSHUTDOWN_GRACE=45s\nADMIN_ADDR=127.0.0.1:1\n")
	write("staging/svc.env", "ADMIN_ADDR=0.0.0.0:9199\nWORKERS=3\n")
	write("loop/common.env", "AUTOPROV_ENV=prod\n")
	write("broken/svc.env", "WORKERS='unclosed\n")

	tests := []struct {
		name    string
		environ map[string]string
		want    map[string]string // key -> value seen
		wantErr string
	}{
		{"no package", map[string]string{"LOG_LEVEL": "warn"}, map[string]string{"LOG_LEVEL": "warn", "WORKERS": ""}, ""},
		{"layers", map[string]string{EnvPackageVar: "staging", ConfigDirVar: dir, "SHUTDOWN_GRACE": "5s"},
			map[string]string{"LOG_LEVEL": "debug", "ADMIN_ADDR": "0.0.0.0:9199", "WORKERS": "3", "SHUTDOWN_GRACE": "5s", "DATABASE_URL": ""}, ""},
		{"path in the name", map[string]string{EnvPackageVar: "../staging", ConfigDirVar: dir}, nil, "is not an environment name"},
		{"missing package", map[string]string{EnvPackageVar: "prod", ConfigDirVar: dir}, nil, "no configuration package"},
		{"a package naming another", map[string]string{EnvPackageVar: "loop", ConfigDirVar: dir}, nil, "cannot name another"},
		{"a file that does not parse", map[string]string{EnvPackageVar: "broken", ConfigDirVar: dir}, nil, "svc.env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv, err := WithEnvPackage(func(k string) string { return tt.environ[k] }, "svc")
			if tt.wantErr != "" {
				var cfgErr *ConfigError
				if err == nil || !errors.As(err, &cfgErr) || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), EnvPackageVar) {
					t.Fatalf("err %v, want a ConfigError naming %s with %q", err, EnvPackageVar, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tt.want {
				if got := getenv(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestRunLoadsEnvPackage: a service binary started with AUTOPROV_ENV reads
// its package; --check-config checks it.
func TestRunLoadsEnvPackage(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "staging"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "staging", "demo.env"), []byte("WORKERS=many\nLOG_LEVEL=loud\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type cfg struct {
		Common
		Workers int `env:"WORKERS" envDefault:"2"`
	}
	p := Program[*cfg]{
		Name: "demo", Summary: "demo",
		NewConfig: func() *cfg { return &cfg{Common: Common{AdminAddr: "127.0.0.1:9199"}} },
		Components: func(context.Context, *cfg, Deps) ([]Component, error) {
			return nil, errors.New("not reached")
		},
	}
	environ := map[string]string{EnvPackageVar: "staging", ConfigDirVar: dir}
	var out, errOut bytes.Buffer
	err := Run(context.Background(), p, []string{"--check-config"}, func(k string) string { return environ[k] }, &out, &errOut)
	var cfgErr *ConfigError
	if !errors.As(err, &cfgErr) || len(cfgErr.Problems) != 2 || !strings.Contains(err.Error(), "WORKERS") || !strings.Contains(err.Error(), "LOG_LEVEL") {
		t.Fatalf("--check-config with a bad package: %v, want its 2 problems", err)
	}
	environ["WORKERS"], environ["LOG_LEVEL"] = "4", "info" // the environment wins
	out.Reset()
	if err := Run(context.Background(), p, []string{"--check-config"}, func(k string) string { return environ[k] }, &out, &errOut); err != nil || !strings.Contains(out.String(), "configuration valid") {
		t.Fatalf("--check-config with the environment over the package: %v %q", err, out.String())
	}
}
