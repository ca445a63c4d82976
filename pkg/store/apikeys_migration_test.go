package store_test

import (
	"context"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// TestMigrationMarksExistingKeysFleetWide runs migration 00048 over API keys
// made before keys were bound to projects: each becomes fleet-wide (it could
// act for every project already) and legacy, so that `deployer keys list`
// flags it; a key written afterwards must be bound or fleet-wide.
func TestMigrationMarksExistingKeysFleetWide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	if err := store.MigrateUpTo(ctx, pool, 47); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO api_keys (id, name, prefix, hash, scopes) VALUES
		('01a21a73-862f-7563-8e2b-b081f91010ca', 'ci', 'apk_aaaaaaaa', decode(repeat('ab', 32), 'hex'), '{deployments:write}'),
		('01a21a73-862f-7563-8e2b-b081f91010cb', 'ops', 'apk_bbbbbbbb', decode(repeat('cd', 32), 'hex'), '{servers:read}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT name, fleet_wide, legacy, cardinality(projects) FROM api_keys ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name string
		var fleetWide, legacy bool
		var projects int
		if err := rows.Scan(&name, &fleetWide, &legacy, &projects); err != nil {
			t.Fatal(err)
		}
		if !fleetWide || !legacy || projects != 0 {
			t.Errorf("key %s after the migration: fleet-wide %v, legacy %v, %d projects; want fleet-wide legacy", name, fleetWide, legacy, projects)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 2 {
		t.Fatalf("%d keys, %v", n, err)
	}
	// New rows are not legacy and need a binding.
	if _, err := pool.Exec(ctx, `INSERT INTO api_keys (id, name, prefix, hash, scopes) VALUES
		(gen_random_uuid(), 'new', 'apk_cccccccc', decode(repeat('ef', 32), 'hex'), '{deployments:read}')`); err == nil {
		t.Error("a key without a binding was stored after the migration")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO api_keys (id, name, prefix, hash, scopes, projects) VALUES
		(gen_random_uuid(), 'new', 'apk_cccccccc', decode(repeat('ef', 32), 'hex'), '{deployments:read}',
		'{9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f}')`); err != nil {
		t.Errorf("a bound key: %v", err)
	}
}
