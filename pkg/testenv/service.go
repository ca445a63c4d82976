package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// ServiceBinary describes a service binary (a main package calling
// service.Main) for ServiceBinaryTests.
type ServiceBinary struct {
	// Dir is the directory of the main package: "." in its main_test.go.
	Dir string
	// Summary is the one-line description --help must show.
	Summary string
	// DefaultAdminAddr is the ADMIN_ADDR default --help must show.
	DefaultAdminAddr string
	// Env is added to the environment of the full start, for settings the
	// service needs on a test machine (infra: PLAYBOOK_DIR, ...).
	Env []string
	// Secrets are settings ("NAME=value") added to the full start whose
	// values are secrets: the running service must not show them in
	// /proc/<pid>/environ (nor DATABASE_URL and REDIS_URL, always set).
	Secrets []string
	// Commands are the binary's subcommands, each of which --help must
	// list on a line of its own with a summary.
	Commands []string
}

// ServiceBinaryTests builds the binary and runs, as parallel subtests, what
// every service binary does:
//
//   - --help exits 0 and lists the summary and the common variables with
//     their defaults;
//   - an invalid LOG_LEVEL exits 2 and names the variable;
//   - a full start on an empty database (its own Redis database, so that
//     the system's fixed stream names are its own) applies the migrations,
//     turns /readyz ready with its postgres and redis checks, serves
//     /metrics and /healthz, and a SIGTERM stops it with status 0, logging
//     the reason and never the database password;
//   - the running service is hardened (service.Main): DATABASE_URL,
//     REDIS_URL and the Secrets are not in its /proc/<pid>/environ, and
//     its core file size limit is 0.
func ServiceBinaryTests(t *testing.T, b ServiceBinary) {
	t.Helper()
	bin := BuildBinary(t, b.Dir)

	t.Run("help lists the variables with defaults", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := RunBinary(t, bin, BinaryEnv(), "--help")
		if code != 0 {
			t.Fatalf("--help exited %d; stderr:\n%s", code, stderr)
		}
		if !strings.Contains(stdout, b.Summary) {
			t.Errorf("--help does not show the summary %q:\n%s", b.Summary, stdout)
		}
		for name, def := range map[string]string{
			"REDIS_URL":      service.DefaultRedisURL,
			"DATABASE_URL":   service.DefaultDatabaseURL,
			"ADMIN_ADDR":     b.DefaultAdminAddr,
			"SHUTDOWN_GRACE": "30s",
		} {
			if !UsageHasRow(stdout, name, def) {
				t.Errorf("--help has no row for %s with default %s:\n%s", name, def, stdout)
			}
		}
		for _, cmd := range b.Commands {
			if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(cmd) + `  +\S`).MatchString(stdout) {
				t.Errorf("--help does not list the command %s with a summary:\n%s", cmd, stdout)
			}
		}
	})

	t.Run("invalid LOG_LEVEL exits 2", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := RunBinary(t, bin, BinaryEnv("LOG_LEVEL=verbose"))
		if code != 2 {
			t.Fatalf("exit status %d, want 2; stderr:\n%s", code, stderr)
		}
		if want := `LOG_LEVEL: "verbose" is not one of debug, info, warn, error`; !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	})

	t.Run("migrates, serves and stops on SIGTERM", func(t *testing.T) {
		t.Parallel()
		dsn := EmptyDatabase(t)
		admin := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
		p := StartBinary(t, bin, BinaryEnv(append([]string{
			"REDIS_URL=" + RedisDB(t),
			"DATABASE_URL=" + dsn,
			"ADMIN_ADDR=" + admin,
			"LOG_FORMAT=json",
		}, append(b.Env, b.Secrets...)...)...))

		body := p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
		AssertHardened(t, p.Pid(), append([]string{"DATABASE_URL=" + dsn, "REDIS_URL=x"}, b.Secrets...)...)
		var ready service.Readiness
		if err := json.Unmarshal([]byte(body), &ready); err != nil {
			t.Fatalf("readyz body %q: %v", body, err)
		}
		for _, check := range []string{"postgres", "redis"} {
			if !ready.Checks[check].OK {
				t.Errorf("readyz check %s: %+v", check, ready.Checks[check])
			}
		}
		if !TableExists(t, dsn, "servers") {
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

// AssertHardened fails the test unless the process pid is hardened the way
// service.Main does it: none of the settings ("NAME=value") is in its
// /proc/<pid>/environ, neither by name nor by value, and its core file
// size limit (soft and hard) is 0. The caller must be able to read the
// process's /proc files (root, or the same user while it is dumpable).
func AssertHardened(t testing.TB, pid int, settings ...string) {
	t.Helper()
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatalf("read the environment block: %v", err)
	}
	for _, kv := range strings.Split(string(environ), "\x00") {
		name, value, _ := strings.Cut(kv, "=")
		for _, s := range settings {
			sName, sValue, _ := strings.Cut(s, "=")
			if name == sName || (len(sValue) >= 8 && strings.Contains(value, sValue)) {
				t.Errorf("/proc/%d/environ shows %s (set as %s)", pid, name, sName)
			}
		}
	}
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatalf("read the limits: %v", err)
	}
	core := ""
	for _, line := range strings.Split(string(limits), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max core file size"); ok {
			core = strings.Join(strings.Fields(rest), " ")
		}
	}
	if !strings.HasPrefix(core, "0 0 ") {
		t.Errorf("core file size limit %q, want 0 0", core)
	}
}

// UsageHasRow reports whether the --help table (service.Usage) has a line
// for the variable name with the default def.
func UsageHasRow(usage, name, def string) bool {
	for _, line := range strings.Split(usage, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name && f[1] == def {
			return true
		}
	}
	return false
}

// EmptyDatabase returns the URL of a fresh database of the test's own
// without any schema (see Postgres), so that a program under test has to
// apply the migrations itself.
func EmptyDatabase(t testing.TB) string {
	t.Helper()
	dsn := Postgres(t)
	ctx, conn := connect(t, dsn)
	if _, err := conn.Exec(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"); err != nil {
		t.Fatalf("empty the test database: %v", err)
	}
	if TableExists(t, dsn, "servers") {
		t.Fatal("servers table still there after emptying the database")
	}
	return dsn
}

// TableExists reports whether the database at dsn has the table in its
// public schema.
func TableExists(t testing.TB, dsn, table string) bool {
	t.Helper()
	ctx, conn := connect(t, dsn)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "public."+table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// connect opens a connection to dsn for the rest of the test, with a
// context that bounds what the test does with it.
func connect(t testing.TB, dsn string) (context.Context, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", redactURL(dsn), err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return ctx, conn
}
