package deployertest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// ProxiedPool returns a pool on a fresh migrated database (closed when the
// test ends) that reaches the shared Postgres through a proxy: the test
// cuts and restores it to put Postgres out of the deployer's reach (pass
// the pool as Options.DB) while other tests keep theirs.
func ProxiedPool(t testing.TB) (*pgxpool.Pool, *testenv.Proxy) {
	t.Helper()
	dsn := testenv.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	pool, err := store.Open(context.Background(), proxy.URL(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}
