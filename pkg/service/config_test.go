package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

// testConfig is a service config as services write them: Common embedded
// with its own admin default, own fields, a secret, a nested prefixed group
// and a Validate method of its own (which does not call Common's: Load
// must validate Common anyway).
type testConfig struct {
	Common
	Token    string  `env:"TOKEN" secret:"true" desc:"API token"`
	Workers  int     `env:"WORKERS" envDefault:"4" desc:"number of workers"`
	Callback url.URL `env:"CALLBACK_URL" desc:"where results go"`
	APIKey   masked  `env:"API_KEY" desc:"key of the API"`
	Vault    struct {
		Addr string `env:"ADDR" envDefault:"http://127.0.0.1:8200" desc:"Vault address"`
		Role string `env:"ROLE,required" desc:"AppRole role id"`
	} `envPrefix:"VAULT_"`
}

func (c *testConfig) Validate() error {
	if c.Workers < 1 {
		return Invalid("WORKERS", "must be at least 1, got %d", c.Workers)
	}
	return nil
}

// masked is a secret type like secrets.Value: it parses from text and
// prints masked, so it needs no secret tag.
type masked struct{ v string }

func (m *masked) UnmarshalText(b []byte) error { m.v = string(b); return nil }
func (m masked) String() string                { return "[REDACTED]" }

func newTestConfig() *testConfig {
	return &testConfig{Common: Common{AdminAddr: "127.0.0.1:9199"}}
}

// plainConfig has no Validate of its own: Common's is promoted to it.
type plainConfig struct {
	Common
}

func getenv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadDefaults(t *testing.T) {
	cfg := newTestConfig()
	if err := Load(getenv(map[string]string{"VAULT_ROLE": "r"}), cfg); err != nil {
		t.Fatal(err)
	}
	want := Common{
		Redis:         RedisConfig{URL: DefaultRedisURL},
		DatabaseURL:   DefaultDatabaseURL,
		LogLevel:      "info",
		LogFormat:     "auto",
		AdminAddr:     "127.0.0.1:9199",
		ShutdownGrace: 30 * time.Second,
	}
	if diff := cmp.Diff(want, cfg.Common); diff != "" {
		t.Errorf("Common (-want, +got):\n%s", diff)
	}
	if cfg.Workers != 4 || cfg.Vault.Addr != "http://127.0.0.1:8200" || cfg.Vault.Role != "r" || cfg.Token != "" {
		t.Errorf("own fields: %+v", cfg)
	}
}

func TestLoadOverrides(t *testing.T) {
	cfg := newTestConfig()
	environ := map[string]string{
		"REDIS_URL":               "redis://:pw@10.0.0.1:6379/2",
		"REDIS_SENTINEL_MASTER":   "mymaster",
		"REDIS_SENTINEL_ADDRS":    "10.0.0.1:26379,10.0.0.2:26379",
		"REDIS_SENTINEL_PASSWORD": "sentinel-pw",
		"DATABASE_URL":            "postgres://u:p@db:5432/x",
		"LOG_LEVEL":               "debug",
		"LOG_FORMAT":              "json",
		"ADMIN_ADDR":              "0.0.0.0:9000",
		"ADMIN_ALLOW_REMOTE":      "true",
		"SHUTDOWN_GRACE":          "5s",
		"TOKEN":                   "t0k",
		"WORKERS":                 "9",
		"CALLBACK_URL":            "https://example.com/cb",
		"API_KEY":                 "k",
		"VAULT_ADDR":              "https://vault:8200",
		"VAULT_ROLE":              "role",
	}
	if err := Load(getenv(environ), cfg); err != nil {
		t.Fatal(err)
	}
	want := Common{
		Redis: RedisConfig{
			URL:              "redis://:pw@10.0.0.1:6379/2",
			SentinelMaster:   "mymaster",
			SentinelAddrs:    []string{"10.0.0.1:26379", "10.0.0.2:26379"},
			SentinelPassword: "sentinel-pw",
		},
		DatabaseURL:      "postgres://u:p@db:5432/x",
		LogLevel:         "debug",
		LogFormat:        "json",
		AdminAddr:        "0.0.0.0:9000",
		AdminAllowRemote: true,
		ShutdownGrace:    5 * time.Second,
	}
	if diff := cmp.Diff(want, cfg.Common); diff != "" {
		t.Errorf("Common (-want, +got):\n%s", diff)
	}
	if cfg.Token != "t0k" || cfg.Workers != 9 || cfg.Callback.Host != "example.com" || cfg.APIKey.v != "k" ||
		cfg.Vault.Addr != "https://vault:8200" || cfg.Vault.Role != "role" {
		t.Errorf("own fields: %+v", cfg)
	}
}

func TestLoadInvalid(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    []string // variables with a problem, in order
		notIn   string   // must not appear in the error
	}{
		{
			name:    "every problem at once",
			environ: map[string]string{"LOG_LEVEL": "verbose", "LOG_FORMAT": "xml", "SHUTDOWN_GRACE": "soon", "ADMIN_ADDR": "nohost", "WORKERS": "0", "DATABASE_URL": "mysql://u:hunter2@db/x", "REDIS_URL": "http://x"},
			want:    []string{"SHUTDOWN_GRACE", "VAULT_ROLE", "REDIS_URL", "DATABASE_URL", "LOG_LEVEL", "LOG_FORMAT", "ADMIN_ADDR", "WORKERS"},
			notIn:   "hunter2",
		},
		{
			name:    "a value that does not parse is not validated again",
			environ: map[string]string{"VAULT_ROLE": "r", "SHUTDOWN_GRACE": "-"},
			want:    []string{"SHUTDOWN_GRACE"},
		},
		{
			name:    "zero grace",
			environ: map[string]string{"VAULT_ROLE": "r", "SHUTDOWN_GRACE": "0s"},
			want:    []string{"SHUTDOWN_GRACE"},
		},
		{
			name:    "workers not a number",
			environ: map[string]string{"VAULT_ROLE": "r", "WORKERS": "many"},
			want:    []string{"WORKERS"},
		},
		{
			name:    "sentinel half configured",
			environ: map[string]string{"VAULT_ROLE": "r", "REDIS_SENTINEL_ADDRS": "a:1"},
			want:    []string{"REDIS_SENTINEL_MASTER"},
		},
		{
			name:    "redis url password not echoed",
			environ: map[string]string{"VAULT_ROLE": "r", "REDIS_URL": "redis://:hunter2@host:6379/x"},
			want:    []string{"REDIS_URL"},
			notIn:   "hunter2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Load(getenv(tt.environ), newTestConfig())
			var cfgErr *ConfigError
			if !errors.As(err, &cfgErr) {
				t.Fatalf("Load error %v, want a *ConfigError", err)
			}
			var got []string
			for _, p := range cfgErr.Problems {
				var fe *FieldError
				if !errors.As(p, &fe) {
					t.Errorf("problem %q is not a *FieldError", p)
					continue
				}
				got = append(got, fe.Var)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("variables with problems (-want, +got):\n%s\nerror:\n%v", diff, err)
			}
			if ExitCode(err) != 2 {
				t.Errorf("ExitCode = %d, want 2", ExitCode(err))
			}
			if tt.notIn != "" && strings.Contains(err.Error(), tt.notIn) {
				t.Errorf("error shows %q:\n%v", tt.notIn, err)
			}
		})
	}
}

func TestLoadMessages(t *testing.T) {
	err := Load(getenv(map[string]string{"LOG_LEVEL": "verbose"}), &plainConfig{Common{AdminAddr: "127.0.0.1:1"}})
	// One problem, once, although Validate is promoted from Common to
	// plainConfig and Load also finds Common as a nested struct.
	if want := `invalid configuration: LOG_LEVEL: "verbose" is not one of debug, info, warn, error`; err == nil || err.Error() != want {
		t.Errorf("error:\n%v\nwant:\n%s", err, want)
	}
}

func TestLoadSecretParseError(t *testing.T) {
	type cfg struct {
		PIN int `env:"PIN" secret:"true"`
	}
	err := Load(getenv(map[string]string{"PIN": "hunter2"}), &cfg{})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "PIN") {
		t.Errorf("error %v: want PIN named, value not shown", err)
	}
}

func TestLoadParseErrorNamesTheVariable(t *testing.T) {
	type group struct {
		Timeout time.Duration `env:"TIMEOUT" envDefault:"1s"`
	}
	type cfg struct {
		A group `envPrefix:"A_"`
		B group `envPrefix:"B_"`
	}
	err := Load(getenv(map[string]string{"B_TIMEOUT": "soon"}), &cfg{})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Var != "B_TIMEOUT" {
		t.Errorf("Load = %v, want a problem with B_TIMEOUT", err)
	}
}

func TestLoadNotAStruct(t *testing.T) {
	var c testConfig
	for _, v := range []any{c, nil, new(int)} {
		if err := Load(getenv(nil), v); err == nil {
			t.Errorf("Load(%T) = nil, want an error", v)
		}
	}
}

func TestUsage(t *testing.T) {
	var buf bytes.Buffer
	Usage(&buf, "svc", "does things", newTestConfig())
	out := buf.String()
	if !strings.HasPrefix(out, "svc: does things\n") {
		t.Errorf("usage does not start with the summary:\n%s", out)
	}
	rows := map[string][2]string{ // variable: default, description
		"REDIS_URL":               {DefaultRedisURL, "Redis URL"},
		"REDIS_SENTINEL_PASSWORD": {"-", "(secret)"},
		"DATABASE_URL":            {DefaultDatabaseURL, "Postgres URL"},
		"LOG_LEVEL":               {"info", "log level: debug, info, warn or error"},
		"LOG_FORMAT":              {"auto", "log format"},
		"ADMIN_ADDR":              {"127.0.0.1:9199", "admin HTTP server"},
		"SHUTDOWN_GRACE":          {"30s", "graceful shutdown"},
		"TOKEN":                   {"-", "API token (secret)"},
		"WORKERS":                 {"4", "number of workers"},
		"VAULT_ADDR":              {"http://127.0.0.1:8200", "Vault address"},
		"VAULT_ROLE":              {"(required)", "AppRole role id"},
	}
	descCol := -1
	found := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		want, ok := rows[f[0]]
		if !ok {
			continue
		}
		found[f[0]] = true
		if f[1] != want[0] {
			t.Errorf("%s default %q, want %q", f[0], f[1], want[0])
		}
		if !strings.Contains(line, want[1]) {
			t.Errorf("%s row %q lacks %q", f[0], line, want[1])
		}
		col := strings.Index(line, f[0]) + len(f[0])
		col += len(line[col:]) - len(strings.TrimLeft(line[col:], " "))
		col += len(f[1])
		col += len(line[col:]) - len(strings.TrimLeft(line[col:], " "))
		if descCol == -1 {
			descCol = col
		} else if col != descCol {
			t.Errorf("%s description starts at column %d, others at %d (not aligned)", f[0], col, descCol)
		}
	}
	for name := range rows {
		if !found[name] {
			t.Errorf("no row for %s in:\n%s", name, out)
		}
	}
}

// TestFieldsMatchEnv checks that the variables Usage and LogConfig list are
// the ones caarlos0/env reads.
func TestFieldsMatchEnv(t *testing.T) {
	cfg := newTestConfig()
	fields, err := fieldsOf(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, f := range fields {
		ours = append(ours, f.Key)
	}
	params, err := env.GetFieldParamsWithOptions(cfg, env.Options{Environment: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	var theirs []string
	for _, p := range params {
		theirs = append(theirs, p.Key)
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	if diff := cmp.Diff(theirs, ours); diff != "" {
		t.Errorf("variables (-env, +ours):\n%s", diff)
	}
}

func TestLogConfig(t *testing.T) {
	cfg := newTestConfig()
	environ := map[string]string{
		"REDIS_URL":               "redis://user:redispw@10.0.0.1:6379/0",
		"REDIS_SENTINEL_MASTER":   "m",
		"REDIS_SENTINEL_ADDRS":    "10.0.0.1:26379,10.0.0.2:26379",
		"REDIS_SENTINEL_PASSWORD": "sentinelpw",
		"DATABASE_URL":            "postgres://autoprov:dbpw@db:5432/x?sslmode=disable",
		"TOKEN":                   "tokenvalue",
		"CALLBACK_URL":            "https://cb:callbackpw@example.com/x",
		"API_KEY":                 "apikeyvalue",
		"VAULT_ROLE":              "role",
	}
	if err := Load(getenv(environ), cfg); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	LogConfig(zerolog.New(&buf), cfg)
	for _, secret := range []string{"redispw", "sentinelpw", "dbpw", "tokenvalue", "callbackpw", "apikeyvalue"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log shows %q:\n%s", secret, buf.String())
		}
	}
	var line struct {
		Message string            `json:"message"`
		Config  map[string]string `json:"config"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	want := map[string]string{
		"REDIS_URL":                          "redis://user:xxxxx@10.0.0.1:6379/0",
		"REDIS_URL_FILE":                     "",
		"REDIS_SENTINEL_MASTER":              "m",
		"REDIS_SENTINEL_ADDRS":               "10.0.0.1:26379,10.0.0.2:26379",
		"REDIS_SENTINEL_PASSWORD":            "[REDACTED]",
		"REDIS_CLUSTER_ADDRS":                "",
		"DATABASE_URL":                       "postgres://autoprov:xxxxx@db:5432/x?sslmode=disable",
		"DATABASE_URL_FILE":                  "",
		"LOG_LEVEL":                          "info",
		"LOG_FORMAT":                         "auto",
		"ADMIN_ADDR":                         "127.0.0.1:9199",
		"ADMIN_ALLOW_REMOTE":                 "false",
		"SHUTDOWN_GRACE":                     "30s",
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
		"OTEL_SERVICE_NAME":                  "",
		"OTEL_SDK_DISABLED":                  "false",
		"TOKEN":                              "[REDACTED]",
		"WORKERS":                            "4",
		"CALLBACK_URL":                       "https://cb:xxxxx@example.com/x",
		"API_KEY":                            "[REDACTED]",
		"VAULT_ADDR":                         "http://127.0.0.1:8200",
		"VAULT_ROLE":                         "role",
	}
	if diff := cmp.Diff(want, line.Config); diff != "" {
		t.Errorf("logged config (-want, +got):\n%s", diff)
	}
	if line.Message != "configuration" {
		t.Errorf("message %q", line.Message)
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		usage    bool
	}{
		{args: nil, wantCode: 0},
		{args: []string{"--help"}, wantCode: 0, usage: true},
		{args: []string{"-h"}, wantCode: 0, usage: true},
		{args: []string{"--port=1"}, wantCode: 2},
		{args: []string{"serve"}, wantCode: 2},
		{args: []string{"--check-config"}, wantCode: 0},
		{args: []string{"--check-config", "serve"}, wantCode: 2},
		{args: []string{"--check-secrets"}, wantCode: 0},
		{args: []string{"--check-secrets", "--secret-refs", "refs.jsonl"}, wantCode: 0},
		{args: []string{"--secret-refs", "refs.jsonl"}, wantCode: 2},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := ParseArgs(tt.args, &out, "svc", "does things", newTestConfig())
		if got := ExitCode(err); got != tt.wantCode {
			t.Errorf("ParseArgs(%q) = %v: exit code %d, want %d", tt.args, err, got, tt.wantCode)
		}
		if tt.usage != strings.Contains(out.String(), "VAULT_ROLE") {
			t.Errorf("ParseArgs(%q) wrote usage %v, want %v:\n%s", tt.args, !tt.usage, tt.usage, out.String())
		}
		if tt.usage && !errors.Is(err, ErrHelp) {
			t.Errorf("ParseArgs(%q) = %v, want ErrHelp", tt.args, err)
		}
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{ErrHelp, 0},
		{ErrCheckConfig, 0},
		{ErrCheckSecrets, 0},
		{&SecretsError{Failed: 1, Total: 2}, 1},
		{&ConfigError{Problems: []error{Invalid("X", "bad")}}, 2},
		{&UsageError{Err: errors.New("bad flag")}, 2},
		{errors.New("boom"), 1},
	}
	for _, tt := range tests {
		if got := ExitCode(tt.err); got != tt.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

// TestLogConfigRedactsEveryCredentialForm: a password in a URL's query
// (libpq's password= and sslpassword=), a token as an http URL's user and
// a keyword/value DSN are masked in the logged configuration too.
func TestLogConfigRedactsEveryCredentialForm(t *testing.T) {
	cfg := newTestConfig()
	environ := map[string]string{
		"DATABASE_URL": "postgres://autoprov@db:5432/x?sslmode=disable&password=querypw&sslpassword=sslpw",
		"CALLBACK_URL": "https://ghp_tokenasuser@example.com/x?token=querytoken",
		"REDIS_URL":    "redis://:onlypw@10.0.0.1:6379/0",
		"VAULT_ROLE":   "role",
	}
	if err := Load(getenv(environ), cfg); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	LogConfig(zerolog.New(&buf), cfg)
	for _, secret := range []string{"querypw", "sslpw", "ghp_tokenasuser", "querytoken", "onlypw"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log shows %q:\n%s", secret, buf.String())
		}
	}
	if !strings.Contains(buf.String(), "postgres://autoprov@db:5432/x?password=xxxxx") {
		t.Errorf("DATABASE_URL not shown redacted:\n%s", buf.String())
	}
}

// TestAdminAddrLoopbackUnlessAllowed: the admin endpoints have no
// authentication, so an ADMIN_ADDR beyond loopback is refused at start
// unless ADMIN_ALLOW_REMOTE says so.
func TestAdminAddrLoopbackUnlessAllowed(t *testing.T) {
	for addr, loopback := range map[string]bool{
		"127.0.0.1:9102": true, "127.9.9.9:1": true, "[::1]:9102": true, "localhost:9102": true,
		"0.0.0.0:9102": false, ":9102": false, "[::]:9102": false, "192.0.2.10:9102": false,
		"admin.example:9102": false, "[::ffff:127.0.0.1]:9102": true, "[fe80::1%eth0]:9102": false,
	} {
		for _, allow := range []string{"", "true"} {
			environ := map[string]string{"ADMIN_ADDR": addr, "VAULT_ROLE": "role", "ADMIN_ALLOW_REMOTE": allow}
			err := Load(getenv(environ), newTestConfig())
			ok := loopback || allow == "true"
			if ok && err != nil {
				t.Errorf("ADMIN_ADDR=%s ADMIN_ALLOW_REMOTE=%q refused: %v", addr, allow, err)
			}
			if !ok && (err == nil || !strings.Contains(err.Error(), "ADMIN_ALLOW_REMOTE")) {
				t.Errorf("ADMIN_ADDR=%s accepted without ADMIN_ALLOW_REMOTE: %v", addr, err)
			}
		}
	}
}

// TestURLFiles: DATABASE_URL_FILE and REDIS_URL_FILE replace the URLs, so
// that their passwords need not be in the process environment; errors name
// the file, never its content.
func TestURLFiles(t *testing.T) {
	dir := t.TempDir()
	db, rd := filepath.Join(dir, "db.url"), filepath.Join(dir, "redis.url")
	if err := os.WriteFile(db, []byte("postgres://u:filepw@db:5432/x?sslmode=disable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rd, []byte("redis://infra:redisfilepw@10.0.0.1:6379/1"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := newTestConfig()
	if err := Load(getenv(map[string]string{"DATABASE_URL_FILE": db, "REDIS_URL_FILE": rd, "VAULT_ROLE": "r"}), cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.DatabaseURL != "postgres://u:filepw@db:5432/x?sslmode=disable" || cfg.Redis.URL != "redis://infra:redisfilepw@10.0.0.1:6379/1" {
		t.Fatalf("urls: %q %q", cfg.DatabaseURL, cfg.Redis.URL)
	}
	var buf bytes.Buffer
	LogConfig(zerolog.New(&buf), cfg)
	if strings.Contains(buf.String(), "filepw") {
		t.Fatalf("logged: %s", buf.String())
	}
	if err := os.WriteFile(db, []byte("mysql://u:filepw@db/x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Load(getenv(map[string]string{"DATABASE_URL_FILE": db, "VAULT_ROLE": "r"}), newTestConfig())
	if err == nil || strings.Contains(err.Error(), "filepw") {
		t.Fatalf("bad URL in file: %v", err)
	}
	err = Load(getenv(map[string]string{"DATABASE_URL_FILE": filepath.Join(dir, "missing"), "VAULT_ROLE": "r"}), newTestConfig())
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL_FILE") {
		t.Fatalf("missing file: %v", err)
	}
}
