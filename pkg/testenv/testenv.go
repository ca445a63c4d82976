// Package testenv gives tests the real services they need.
//
// A service is taken from its environment variable when set (REDIS_URL,
// DATABASE_URL: `make test` starts both from Debian packages), else from
// testcontainers-go when a Docker engine answers, else the test fails with a
// message saying how to provide it. Tests never skip for a missing service.
// Under `go test -short` (`make test-unit`) every helper that gives a real
// service (Redis, Postgres, sshd, S3) skips the test instead: the fast inner
// loop runs only the tests that need none. Without -short nothing skips.
//
// Every test gets isolated resources: unique stream and group names, and a
// fresh migrated Postgres database (a copy of a template database migrated
// once) that is dropped when the test ends.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

const missingHint = "run the tests through `make test` (it starts Redis and Postgres), set %s, or provide a Docker engine for testcontainers"

// skipShort skips the test under -short: it needs a real service (what).
func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: skipped under -short (make test-unit); make test runs it", what)
	}
}

// Unique returns prefix followed by a random suffix, for stream, group and
// database names that no other test (or test process) uses.
func Unique(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

var (
	redisOnce sync.Once
	redisURL  string
	redisErr  error
)

// RedisURL returns the URL of a Redis 7 server for tests.
func RedisURL(t testing.TB) string {
	t.Helper()
	skipShort(t, "Redis")
	redisOnce.Do(func() {
		if u := os.Getenv("REDIS_URL"); u != "" {
			redisURL = u
			return
		}
		if !dockerAvailable() {
			redisErr = fmt.Errorf("no Redis: "+missingHint, "REDIS_URL")
			return
		}
		redisURL, redisErr = startRedisContainer(context.Background())
	})
	if redisErr != nil {
		t.Fatal(redisErr)
	}
	return redisURL
}

// Redis returns a client for the test Redis, closed when the test ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("parse REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s does not answer: %v", opt.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var (
	pgOnce sync.Once
	pgURL  string
	pgErr  error
)

// PostgresURL returns the URL of the Postgres server for tests (its
// maintenance database); use Postgres for a database of the test's own.
func PostgresURL(t testing.TB) string {
	t.Helper()
	skipShort(t, "Postgres")
	pgOnce.Do(func() {
		if u := os.Getenv("DATABASE_URL"); u != "" {
			pgURL = u
			return
		}
		if !dockerAvailable() {
			pgErr = fmt.Errorf("no Postgres: "+missingHint, "DATABASE_URL")
			return
		}
		pgURL, pgErr = startPostgresContainer(context.Background())
	})
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	return pgURL
}

// Postgres creates a fresh database with the schema migrated, drops it when
// the test ends, and returns its URL. The database is a copy of a template
// migrated once per schema (see migratedTemplate), so it costs milliseconds.
func Postgres(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := PostgresURL(t)
	name := Unique("test_")
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to test postgres: %v", err)
	}
	defer admin.Close(ctx)
	template, err := migratedTemplate(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if err := createFromTemplate(ctx, admin, name, template); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(base, name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Pool returns a pool on a fresh migrated database (see Postgres), closed
// when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := Postgres(t)
	pool, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withDatabase returns dsn with its database name replaced.
func withDatabase(dsn, name string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL, got %q", redactURL(dsn))
	}
	u.Path = "/" + name
	return u.String(), nil
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// InCI reports whether the tests run in CI (CI set to anything but "" or "false").
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}

// WaitFor polls cond every 20ms until it holds, and fails the test when
// timeout passes first, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
