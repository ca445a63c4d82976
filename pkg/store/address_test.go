package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// addressCases are spellings of addresses and their canonical form ("" for
// refused ones). The Go function and the database's must agree on every
// one of them.
var addressCases = []struct{ in, want string }{
	{"192.0.2.1", "192.0.2.1"},
	{"::ffff:192.0.2.1", "192.0.2.1"},
	{"::FFFF:192.0.2.1", "192.0.2.1"},
	{"::ffff:c000:201", "192.0.2.1"},
	{"0:0:0:0:0:ffff:c000:0201", "192.0.2.1"},
	{"::ffff:127.0.0.1", "127.0.0.1"},
	{"fd00:5ec:0:0::2", "fd00:5ec::2"},
	{"FD00:05EC:0000:0000:0000:0000:0000:0002", "fd00:5ec::2"},
	{"2001:DB8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},
	{"2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"},
	{"2001:db8::1", "2001:db8::1"},
	{"2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"},
	{"2001:db8:1:1:1:1:1:0", "2001:db8:1:1:1:1:1:0"},
	{"2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"},
	{"1:0:0:0:0:0:0:0", "1::"},
	{"::", "::"},
	{"::1", "::1"},
	{"0:0:0:0:0:0:0:1", "::1"},
	{"64:ff9b::192.0.2.1", "64:ff9b::c000:201"},
	{"fe80::1", "fe80::1"},
	{"Web-1.Example.COM", "web-1.example.com"},
	{"web-1.example.com.", "web-1.example.com"},
	{"localhost", "localhost"},
	{"host-1", "host-1"},
	{"3com.example", "3com.example"},
	// Refused.
	{"", ""},
	{"fe80::1%eth0", ""},
	{"192.0.2.1/32", ""},
	{"2001:db8::/64", ""},
	{"192.0.2.1:22", ""},
	{"[2001:db8::1]", ""},
	{"[2001:db8::1]:22", ""},
	{" 192.0.2.1", ""},
	{"192.0.2.1 ", ""},
	{"010.1.1.1", ""},
	{"192.0.2.01", ""},
	{"1.2.3", ""},
	{"10.1", ""},
	{"2130706433", ""},
	{"0x7f000001", ""},
	{"0x7f.1", ""},
	{"256.1.1.1", ""},
	{"::192.0.2.1", ""},
	{"::c000:201", ""},
	{"-host", ""},
	{"host-", ""},
	{"a..b", ""},
	{"under_score", ""},
	{"ho st", ""},
	{"host/../x", ""},
	{"xn--bcher-kva.example", "xn--bcher-kva.example"},
}

func TestCanonicalAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range addressCases {
		got, err := store.CanonicalAddress(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("CanonicalAddress(%q) = %q, want an error", tc.in, got)
		case tc.want == "" && !errors.Is(err, store.ErrInvalidAddress):
			t.Errorf("CanonicalAddress(%q): err = %v, want ErrInvalidAddress", tc.in, err)
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("CanonicalAddress(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		address string
		port    int
		want    string
	}{
		{"::ffff:192.0.2.1", 0, "address:192.0.2.1:22"},
		{"192.0.2.1", 2222, "address:192.0.2.1:2222"},
		{"2001:DB8::1", 22, "address:[2001:db8::1]:22"},
	} {
		if got, err := store.AddressTarget(tc.address, tc.port); err != nil || got != tc.want {
			t.Errorf("AddressTarget(%q, %d) = %q, %v; want %q", tc.address, tc.port, got, err, tc.want)
		}
	}
}

// TestCanonicalAddressDatabaseAgrees checks that the database's function
// (used by its trigger and check) and Go's give the same answer for every
// case, so that nothing Go writes is refused and nothing Go compares with
// is spelled differently.
func TestCanonicalAddressDatabaseAgrees(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	for _, tc := range addressCases {
		var db *string
		if err := pool.QueryRow(ctx, `SELECT autoprov_canonical_address($1)`, tc.in).Scan(&db); err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		got := ""
		if db != nil {
			got = *db
		}
		if tc.in == "" && got == "" {
			continue
		}
		if got != tc.want {
			t.Errorf("autoprov_canonical_address(%q) = %q, want %q (as Go)", tc.in, got, tc.want)
		}
	}
}

// TestServerAddressStoredCanonical: whatever spelling a writer uses, the
// row holds the canonical address, and another spelling finds it.
func TestServerAddressStoredCanonical(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	addServer(t, pool, "mapped", "::ffff:192.0.2.1")
	addServer(t, pool, "v6", "fd00:5ec:0:0::2")
	for handle, want := range map[string]string{"mapped": "192.0.2.1", "v6": "fd00:5ec::2"} {
		s, err := store.GetServer(ctx, pool, handle)
		if err != nil {
			t.Fatal(err)
		}
		if s.Address != want {
			t.Errorf("%s stored as %q, want %q", handle, s.Address, want)
		}
	}
	for in, want := range map[string]string{
		"192.0.2.1": "mapped", "::ffff:c000:201": "mapped", "::ffff:192.0.2.1": "mapped",
		"fd00:5ec::2": "v6", "FD00:5EC:0:0:0:0:0:2": "v6",
	} {
		s, err := store.FindServerByAddress(ctx, pool, in)
		if err != nil || s.Handle != want {
			t.Errorf("FindServerByAddress(%q) = %v, %v; want %s", in, s, err, want)
		}
	}
	if _, err := store.FindServerByAddress(ctx, pool, "fe80::1%eth0"); !errors.Is(err, store.ErrInvalidAddress) {
		t.Errorf("zone: err = %v, want ErrInvalidAddress", err)
	}

	// Updates are canonicalised too, and a refused address changes nothing.
	if _, err := store.SetServerAddress(ctx, pool, "v6", "::FFFF:198.51.100.9"); err != nil {
		t.Fatal(err)
	}
	if s, _ := store.GetServer(ctx, pool, "v6"); s.Address != "198.51.100.9" {
		t.Errorf("after SetServerAddress: %q", s.Address)
	}
	for _, bad := range []string{"10.1", "0x7f000001", "::127.0.0.1", "host name"} {
		if _, err := pool.Exec(ctx, `UPDATE servers SET address = $1 WHERE handle = 'mapped'`, bad); err == nil {
			t.Errorf("UPDATE to %q accepted", bad)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('bad', $1)`, bad); err == nil {
			t.Errorf("INSERT of %q accepted", bad)
		}
	}
	if s, _ := store.GetServer(ctx, pool, "mapped"); s.Address != "192.0.2.1" {
		t.Errorf("refused update changed the address to %q", s.Address)
	}

	// The check holds even for a writer that bypasses triggers.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET session_replication_role`) //nolint:errcheck
	if _, err := conn.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('alias', '::ffff:192.0.2.1')`); err == nil {
		t.Error("non-canonical address inserted with triggers off: the check is missing")
	}
}

// TestHostKeyPinnedOncePerHost: a pin taken under one spelling is found
// under every other one, so an alias cannot pin a second key.
func TestHostKeyPinnedOncePerHost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	pinned, err := store.PinHostKey(ctx, pool, "192.0.2.7", 22, "ssh-ed25519 AAAAfirst")
	if err != nil || pinned != "ssh-ed25519 AAAAfirst" {
		t.Fatalf("pin: %q %v", pinned, err)
	}
	for _, alias := range []string{"::ffff:192.0.2.7", "::ffff:c000:207", "0:0:0:0:0:ffff:192.0.2.7"} {
		key, err := store.GetHostKey(ctx, pool, alias, 22)
		if err != nil || key != "ssh-ed25519 AAAAfirst" {
			t.Errorf("GetHostKey(%s) = %q, %v; want the pinned key", alias, key, err)
		}
		got, err := store.PinHostKey(ctx, pool, alias, 22, "ssh-ed25519 AAAAattacker")
		if err != nil || got != "ssh-ed25519 AAAAfirst" {
			t.Errorf("PinHostKey(%s) = %q, %v; want the first key to stand", alias, got, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM host_keys`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("host_keys rows = %d (%v), want 1", n, err)
	}
	if _, err := store.PinHostKey(ctx, pool, "10.1", 22, "ssh-ed25519 AAAAx"); !errors.Is(err, store.ErrInvalidAddress) {
		t.Errorf("numeric name: err = %v", err)
	}
}

// TestMigrationCanonicalisesExistingRows runs migration 00010 over rows an
// older schema accepted: aliases are rewritten, duplicate pins keep the
// first, and the run locks of both spellings become one.
func TestMigrationCanonicalisesExistingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	if err := store.MigrateUpTo(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO servers (handle, address) VALUES ('mapped', '::ffff:192.0.2.1'), ('v6', 'fd00:5ec:0:0::2'), ('name', 'Web.Example.com.')`,
		`INSERT INTO host_keys (address, ssh_port, host_key, pinned_at) VALUES
			('192.0.2.9', 22, 'ssh-ed25519 AAAAlater', now()),
			('::ffff:192.0.2.9', 22, 'ssh-ed25519 AAAAfirst', now() - interval '1 day'),
			('2001:DB8::1', 22, 'ssh-ed25519 AAAAv6', now())`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for handle, want := range map[string]string{"mapped": "192.0.2.1", "v6": "fd00:5ec::2", "name": "web.example.com"} {
		s, err := store.GetServer(ctx, pool, handle)
		if err != nil || s.Address != want {
			t.Errorf("%s: %v %v, want address %s", handle, s, err, want)
		}
	}
	if key, _ := store.GetHostKey(ctx, pool, "192.0.2.9", 22); key != "ssh-ed25519 AAAAfirst" {
		t.Errorf("duplicate pins: kept %q, want the first pinned", key)
	}
	if key, _ := store.GetHostKey(ctx, pool, "2001:db8::1", 22); key != "ssh-ed25519 AAAAv6" {
		t.Errorf("v6 pin: %q", key)
	}
}

// TestMigrationRefusesUnusableAddresses: a row whose address is no address
// stops the migration with a message naming it, rather than being guessed.
func TestMigrationRefusesUnusableAddresses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	if err := store.MigrateUpTo(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('broken', 'fe80::1%eth0')`); err != nil {
		t.Fatal(err)
	}
	_, err := store.Migrate(ctx, pool)
	if err == nil {
		t.Fatal("migration accepted an unusable address")
	}
	if want := "'broken'"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the server %s", err, want)
	}
}

// emptyDatabase returns a pool on a fresh database without migrations.
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	base := testenv.PostgresURL(t)
	name := testenv.Unique("test_")
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgxpool.New(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := store.Open(ctx, u.String())
	if err != nil {
		t.Fatal(fmt.Errorf("open %s: %w", name, err))
	}
	t.Cleanup(pool.Close)
	return pool
}
