package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestCountRoundTrips: a query, an Exec and a batch of three statements
// are three round trips on the counting context (and on contexts derived
// from it); work on other contexts is not counted.
func TestCountRoundTrips(t *testing.T) {
	pool := testenv.Pool(t)
	ctx, count := store.CountRoundTrips(context.Background())
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatal(err)
	}
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := pool.Exec(child, `SELECT 2`); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	for range 3 {
		b.Queue(`SELECT 3`)
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `SELECT 4`); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 3 {
		t.Errorf("round trips = %d, want 3", got)
	}
}
