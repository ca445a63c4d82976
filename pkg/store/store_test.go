package store_test

import (
	"context"
	"sync"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestMigrateConcurrentReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t) // already migrated once
	// Five replicas start together against the same database: each must
	// succeed, none may apply a migration twice.
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := store.Open(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer pool.Close()
			applied, err := store.Migrate(ctx, pool)
			if err != nil {
				errs <- err
				return
			}
			if len(applied) != 0 {
				t.Errorf("replica applied %d migrations on a migrated database", len(applied))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	v, err := store.SchemaVersion(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if v < 1 {
		t.Fatalf("schema version = %d, want >= 1", v)
	}
}

func TestServerMinimalInsertTakesDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port) VALUES ('web-1', '192.0.2.10', 2222)`); err != nil {
		t.Fatal(err)
	}
	var user, status, labels string
	var version int64
	err := pool.QueryRow(ctx, `SELECT ssh_user, status, labels::text, version FROM servers WHERE handle='web-1'`).
		Scan(&user, &status, &labels, &version)
	if err != nil {
		t.Fatal(err)
	}
	if user != "root" || status != "NEW" || labels != "{}" || version != 1 {
		t.Fatalf("defaults: user=%q status=%q labels=%q version=%d", user, status, labels, version)
	}
	// Every update bumps the version, so compare-and-set writers see each other.
	if _, err := pool.Exec(ctx, `UPDATE servers SET status='QUEUED' WHERE handle='web-1'`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT version FROM servers WHERE handle='web-1'`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 2 {
		t.Fatalf("version after update = %d, want 2", version)
	}
	// Invalid values are refused by the schema itself.
	for _, q := range []string{
		`INSERT INTO servers (handle, address) VALUES ('bad-status', 'x') ON CONFLICT DO NOTHING; UPDATE servers SET status='BOGUS' WHERE handle='bad-status'`,
		`INSERT INTO servers (handle, address, ssh_port) VALUES ('bad-port', 'x', 70000)`,
		`INSERT INTO servers (handle, address) VALUES ('', 'x')`,
	} {
		if _, err := pool.Exec(ctx, q); err == nil {
			t.Errorf("schema accepted %q", q)
		}
	}
}
