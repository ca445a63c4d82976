package sources

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// fakeDNS answers names of the .test domain from a table.
func fakeDNS(table map[string]string) func(context.Context, string, string) ([]netip.Addr, error) {
	return func(_ context.Context, _, host string) ([]netip.Addr, error) {
		if a, ok := table[host]; ok {
			return []netip.Addr{netip.MustParseAddr(a)}, nil
		}
		return nil, errors.New("no such host")
	}
}

// TestGuardedFetch: with a guard, a repository at a special address is
// refused before git runs (the server sees no request), and git connects
// to the address that was checked, whatever a second lookup would say.
// Every address here stays on this machine even if the guard broke.
func TestGuardedFetch(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/pinned.git")
	want := repo.Commit(t, map[string]string{"a.yml": "1"})
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	dns := fakeDNS(map[string]string{"git.example.test": "127.0.0.1", "zero.example.test": "0.0.0.0"})

	strictGuard, err := authz.NewGuard(authz.SpecialConfig{}, authz.Options{})
	if err != nil {
		t.Fatal(err)
	}
	strict, argvs := newCache(t, Config{})
	strict.guard, strict.lookup = strictGuard, dns
	for _, u := range []string{repo.URL, "http://localhost:" + port + "/acme/pinned.git", "http://git.example.test:" + port + "/acme/pinned.git", "http://zero.example.test:" + port + "/x.git", "http://[::1]:" + port + "/x.git"} {
		_, err := strict.Checkout(context.Background(), Repo{URL: u, Token: "tok"}, filepath.Join(t.TempDir(), "src"))
		if !errors.Is(err, authz.ErrDenied) {
			t.Errorf("%s: err = %v, want authz.ErrDenied", u, err)
		}
	}
	if n := srv.Authorized.Load() + srv.Refused.Load(); n != 0 {
		t.Fatalf("refused fetches reached the server %d times", n)
	}
	for _, a := range *argvs {
		if strings.Contains(strings.Join(a, " "), "fetch") {
			t.Errorf("git fetch ran for a refused address: %q", a)
		}
	}

	// Loopback allowed: git.example.test, a name no real resolver knows,
	// works only because git connects to the address checked here.
	loopback, err := authz.NewGuard(authz.SpecialConfig{AllowNetworks: []string{"127.0.0.0/8"}}, authz.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newCache(t, Config{})
	c.guard, c.lookup = loopback, dns
	got, err := c.Checkout(context.Background(), Repo{URL: "http://git.example.test:" + port + "/acme/pinned.git", Token: "tok"}, filepath.Join(t.TempDir(), "src"))
	if err != nil || got != want {
		t.Fatalf("pinned fetch: %s, %v", got, err)
	}
	if _, err := c.Checkout(context.Background(), Repo{URL: "http://zero.example.test:" + port + "/x.git"}, filepath.Join(t.TempDir(), "src")); !errors.Is(err, authz.ErrDenied) {
		t.Errorf("unspecified address with loopback allowed: err = %v", err)
	}
}
