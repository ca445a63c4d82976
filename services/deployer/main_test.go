package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/app"
)

// TestBinary runs the real binary end to end: --help, a configuration
// error, and a full start (migrations on an empty database, readiness,
// metrics) and graceful stop on SIGTERM.
func TestBinary(t *testing.T) {
	bin := testenv.BuildBinary(t, ".")

	t.Run("help lists the variables with defaults", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := testenv.RunBinary(t, bin, testenv.BinaryEnv(), "--help")
		if code != 0 {
			t.Fatalf("--help exited %d; stderr:\n%s", code, stderr)
		}
		if !strings.Contains(stdout, app.Summary) {
			t.Errorf("--help does not show the summary %q:\n%s", app.Summary, stdout)
		}
		for name, def := range map[string]string{
			"REDIS_URL":      service.DefaultRedisURL,
			"DATABASE_URL":   service.DefaultDatabaseURL,
			"ADMIN_ADDR":     app.DefaultAdminAddr,
			"SHUTDOWN_GRACE": "30s",
		} {
			if !hasRow(stdout, name, def) {
				t.Errorf("--help has no row for %s with default %s:\n%s", name, def, stdout)
			}
		}
	})

	t.Run("invalid LOG_LEVEL exits 2", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := testenv.RunBinary(t, bin, testenv.BinaryEnv("LOG_LEVEL=verbose"))
		if code != 2 {
			t.Fatalf("exit status %d, want 2; stderr:\n%s", code, stderr)
		}
		if want := `LOG_LEVEL: "verbose" is not one of debug, info, warn, error`; !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	})

	t.Run("migrates, serves and stops on SIGTERM", func(t *testing.T) {
		t.Parallel()
		dsn := emptyDatabase(t)
		admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		p := testenv.StartBinary(t, bin, testenv.BinaryEnv(
			"REDIS_URL="+testenv.RedisURL(t),
			"DATABASE_URL="+dsn,
			"ADMIN_ADDR="+admin,
			"API_ADDR=127.0.0.1:0",
			"LOG_FORMAT=json",
		))

		body := p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
		var ready service.Readiness
		if err := json.Unmarshal([]byte(body), &ready); err != nil {
			t.Fatalf("readyz body %q: %v", body, err)
		}
		for _, check := range []string{"postgres", "redis"} {
			if !ready.Checks[check].OK {
				t.Errorf("readyz check %s: %+v", check, ready.Checks[check])
			}
		}
		if !tableExists(t, dsn, "servers") {
			t.Error("servers table missing: migrations not applied")
		}
		if !strings.Contains(p.Stderr(), `"message":"migration applied"`) {
			t.Errorf("no migration logged:\n%s", p.Stderr())
		}
		metrics := p.WaitHTTP("http://"+admin+"/metrics", 200, 10*time.Second)
		for _, m := range []string{"go_goroutines", "process_start_time_seconds"} {
			if !strings.Contains(metrics, m) {
				t.Errorf("/metrics lacks %s", m)
			}
		}
		p.WaitHTTP("http://"+admin+"/healthz", 200, 10*time.Second)

		p.Signal(syscall.SIGTERM)
		if code := p.Wait(30 * time.Second); code != 0 {
			t.Errorf("exit status %d after SIGTERM, want 0", code)
		}
		logs := p.Stderr()
		if !strings.Contains(logs, `"reason":"received terminated"`) {
			t.Errorf("shutdown reason not logged:\n%s", logs)
		}
		if u, _ := url.Parse(dsn); u != nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && strings.Contains(logs, ":"+pw+"@") {
				t.Errorf("the database password appears in the logs:\n%s", logs)
			}
		}
	})
}

// hasRow reports whether the usage table has a line for name with def.
func hasRow(usage, name, def string) bool {
	for _, line := range strings.Split(usage, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name && f[1] == def {
			return true
		}
	}
	return false
}

// emptyDatabase returns the URL of a fresh database without any schema, so
// that the binary has to apply the migrations itself.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"); err != nil {
		t.Fatalf("empty the test database: %v", err)
	}
	if tableExists(t, dsn, "servers") {
		t.Fatal("servers table still there after emptying the database")
	}
	return dsn
}

func tableExists(t *testing.T, dsn, table string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "public."+table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}
