package testenv

import (
	"context"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// TestPostgresCopiesMigratedTemplate checks that every test database is a
// migrated copy of the one template, and that the template takes no
// connections (CREATE DATABASE ... TEMPLATE needs none on it).
func TestPostgresCopiesMigratedTemplate(t *testing.T) {
	ctx := context.Background()
	a, b := Pool(t), Pool(t)
	va, err := store.SchemaVersion(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := store.SchemaVersion(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if va == 0 || va != vb {
		t.Fatalf("schema versions %d and %d, want the same, above 0", va, vb)
	}
	// A row written in one copy is not in the other.
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("copy b sees a's table: n=%d err=%v", n, err)
	}
	var isTemplate, allowConn bool
	err = a.QueryRow(ctx, "SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1", templateName()).
		Scan(&isTemplate, &allowConn)
	if err != nil || !isTemplate || allowConn {
		t.Fatalf("template %s: is_template=%v allow_connections=%v err=%v", templateName(), isTemplate, allowConn, err)
	}
}
