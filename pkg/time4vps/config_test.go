package time4vps_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	var cfg time4vps.Config
	err := env.ParseWithOptions(&cfg, env.Options{Environment: map[string]string{
		"TIME4VPS_USERNAME":           "ops@example.com",
		"TIME4VPS_PASSWORD":           "Env-Passw0rd-1",
		"TIME4VPS_TIMEOUT":            "12s",
		"TIME4VPS_TASK_POLL_INTERVAL": "3s",
	}})
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	want := time4vps.Config{
		URL:              time4vps.DefaultURL,
		Username:         "ops@example.com",
		Password:         "Env-Passw0rd-1",
		Timeout:          12 * time.Second,
		ConnectTimeout:   time4vps.DefaultConnectTimeout,
		TaskPollInterval: 3 * time.Second,
		RetryMax:         time4vps.DefaultRetryMax,
		RetryWaitMin:     time4vps.DefaultRetryWaitMin,
		RetryWaitMax:     time4vps.DefaultRetryWaitMax,
	}
	if d := cmp.Diff(want, cfg); d != "" {
		t.Errorf("config (-want +got):\n%s", d)
	}
	if _, err := time4vps.New(cfg, zerolog.Nop()); err != nil {
		t.Errorf("New: %v", err)
	}
}

// Every field has an env name and a description for --help.
func TestConfigTags(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[time4vps.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !strings.HasPrefix(f.Tag.Get("env"), "TIME4VPS_") || f.Tag.Get("desc") == "" {
			t.Errorf("field %s: env=%q desc=%q", f.Name, f.Tag.Get("env"), f.Tag.Get("desc"))
		}
	}
}

func TestConfigPasswordFile(t *testing.T) {
	t.Parallel()
	api := time4vpstest.Start(t, time4vpstest.Config{})
	api.AddServer(time4vpstest.VPS{ID: 1, IP: "192.0.2.1"})
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte(api.Password()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := time4vps.New(time4vps.Config{URL: api.URL(), Username: api.Username(), PasswordFile: path}, zerolog.Nop())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	got, err := c.ListServers(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("ListServers with the file's password = %v, %v", got, err)
	}
}

func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	const pw = "Invalid-Case-Passw0rd"
	missing := filepath.Join(t.TempDir(), "missing")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() time4vps.Config { return time4vps.Config{Username: "u@example.com", Password: pw} }
	for _, tc := range []struct {
		name string
		edit func(*time4vps.Config)
		want string
	}{
		{"no username", func(c *time4vps.Config) { c.Username = "" }, "TIME4VPS_USERNAME is required"},
		{"no password", func(c *time4vps.Config) { c.Password = "" }, "TIME4VPS_PASSWORD or TIME4VPS_PASSWORD_FILE is required"},
		{"password and file", func(c *time4vps.Config) { c.PasswordFile = empty }, "only one of"},
		{"missing file", func(c *time4vps.Config) { c.Password = ""; c.PasswordFile = missing }, "read TIME4VPS_PASSWORD_FILE"},
		{"empty file", func(c *time4vps.Config) { c.Password = ""; c.PasswordFile = empty }, "is empty"},
		{"credentials in URL", func(c *time4vps.Config) { c.URL = "https://u:" + pw + "@billing.example.com/api" }, "must not hold credentials"},
		{"broken URL", func(c *time4vps.Config) { c.URL = "https://u:" + pw + "@bad host/%zz" }, "not a valid URL"},
		{"ftp URL", func(c *time4vps.Config) { c.URL = "ftp://billing.example.com/api" }, "scheme"},
		{"URL with query", func(c *time4vps.Config) { c.URL = "https://billing.example.com/api?token=x" }, "query"},
		{"negative timeout", func(c *time4vps.Config) { c.Timeout = -time.Second }, "TIME4VPS_TIMEOUT must be positive"},
		{"max wait below min", func(c *time4vps.Config) { c.RetryWaitMin = time.Minute; c.RetryWaitMax = time.Second }, "below"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.edit(&cfg)
			_, err := time4vps.New(cfg, zerolog.Nop())
			if err == nil {
				t.Fatal("New accepted an invalid config")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error holds the password: %v", err)
			}
		})
	}
}

func TestSecretNeverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "Printed-Passw0rd-77"
	cfg := time4vps.Config{Username: "u@example.com", Password: pw}
	var logs testenv.SafeBuffer
	logger := zerolog.New(&logs)
	logger.Info().Interface("cfg", cfg).Msg("config")
	j, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{
		fmt.Sprintf("%v %+v %#v %s %q", cfg, cfg, cfg, cfg.Password, cfg.Password),
		string(j),
		logs.String(),
	} {
		if strings.Contains(out, pw) {
			t.Errorf("password printed: %s", out)
		}
	}
	if string(cfg.Password) != pw {
		t.Error("string conversion lost the value")
	}
}
