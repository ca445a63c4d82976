package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// The migrated schema is built once into a template database and every test
// database is a copy of it (CREATE DATABASE ... TEMPLATE): a copy takes
// milliseconds where running every migration took a large share of each
// test. The template is named by a digest of the embedded migrations, so
// test processes of different trees (worktrees, branches) sharing one
// Postgres never use a template of another schema; templates of old schemas
// stay behind (small; `make stop` or a fresh cluster clears them).
// Model: river's riverdbtest.

var (
	templateMu   sync.Mutex
	templateDone = map[string]string{} // base URL -> template name, once built or found
)

// templateName is the template database of the embedded migrations.
func templateName() string {
	return "test_tmpl_" + store.MigrationsDigest()[:16]
}

// migratedTemplate returns the name of the template database holding the
// migrated schema on the server of base, building it when missing. Test
// processes running side by side serialise on an advisory lock of the
// maintenance database; a template left half-built by a killed process is
// not marked IS_TEMPLATE and is rebuilt.
func migratedTemplate(ctx context.Context, base string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if name, ok := templateDone[base]; ok {
		return name, nil
	}
	name := templateName()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect to test postgres: %w", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return "", fmt.Errorf("lock template %s: %w", name, err)
	}
	// Closing the session releases the lock too; unlock explicitly so a
	// long-lived admin connection never holds it.
	defer func() { _, _ = admin.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", name) }()

	var isTemplate bool
	err = admin.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		templateDone[base] = name
		return name, nil
	case err == nil: // half-built by a process that died: start again
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return "", fmt.Errorf("drop half-built template %s: %w", name, err)
		}
	case err != pgx.ErrNoRows:
		return "", fmt.Errorf("look up template %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create template %s: %w", name, err)
	}
	dsn, err := withDatabase(base, name)
	if err != nil {
		return "", err
	}
	pool, err := store.Open(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("template %s: %w", name, err)
	}
	_, err = store.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template %s: %w", name, err)
	}
	// No connections from now on: CREATE DATABASE ... TEMPLATE refuses a
	// template that has any, and the mark says the build completed.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+name+" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true"); err != nil {
		return "", fmt.Errorf("mark template %s: %w", name, err)
	}
	templateDone[base] = name
	return name, nil
}

// createFromTemplate creates database name as a copy of template, retrying
// for a while when the server still counts a closing session on the
// template (it refuses the copy then).
func createFromTemplate(ctx context.Context, admin *pgx.Conn, name, template string) error {
	for {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+template)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use
			return fmt.Errorf("create test database from %s: %w", template, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create test database from %s: %w", template, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
