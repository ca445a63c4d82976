package authz

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

func fakeIfaces(addrs ...string) func() ([]net.Addr, error) {
	return func() ([]net.Addr, error) {
		var out []net.Addr
		for _, a := range addrs {
			ip, n, err := net.ParseCIDR(a)
			if err != nil {
				panic(err)
			}
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}
}

func newAuthorizer(t *testing.T, cfg Config, ifaces ...string) *Authorizer {
	t.Helper()
	if cfg.SecretRefs == nil {
		cfg.SecretRefs = []string{"vault:secret/projects/{project_id}/**"}
	}
	a, err := New(cfg, Options{InterfaceAddrs: fakeIfaces(ifaces...)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestTarget(t *testing.T) {
	a := newAuthorizer(t, Config{AllowNetworks: []string{"203.0.113.0/24", "2001:db8::/32", "0.0.0.0/0", "::/0"}},
		"127.0.0.1/8", "::1/128", "192.0.2.10/24", "2001:db8:1::5/64")
	allowed := []string{"203.0.113.9", "198.51.100.7", "2001:db8:2::1", "::ffff:203.0.113.9", "8.8.8.8"}
	for _, ip := range allowed {
		if err := a.Target(context.Background(), ip, false); err != nil {
			t.Errorf("%s: %v", ip, err)
		}
	}
	// Never, whatever DEPLOY_ALLOW_NETWORKS says (it allows everything here).
	refused := map[string]string{
		"127.0.0.1":              "loopback",
		"127.1.2.3":              "loopback",
		"::1":                    "loopback",
		"::ffff:127.0.0.1":       "loopback",
		"0.0.0.0":                "unspecified",
		"0.1.2.3":                "unspecified",
		"::":                     "unspecified",
		"169.254.169.254":        "link-local",
		"::ffff:169.254.169.254": "link-local",
		"fe80::1":                "link-local",
		"224.0.0.1":              "multicast",
		"239.255.255.250":        "multicast",
		"ff02::1":                "multicast",
		"255.255.255.255":        "broadcast",
		"240.0.0.1":              "reserved",
		"192.0.2.10":             "address of this host",
		"2001:db8:1::5":          "address of this host",
		"192.0.2.255":            "broadcast address of this host's network",
		"fd00:ec2::254":          "metadata",
		"100.100.100.200":        "metadata",
		"64:ff9b::7f00:1":        "NAT64",
		"64:ff9b::a9fe:a9fe":     "NAT64",
		"2002:7f00:1::1":         "6to4",
		"::127.0.0.1":            "IPv4-compatible",
		"fe80::1%eth0":           "zone",
		"example.com":            "not an IP",
	}
	for ip, want := range refused {
		err := a.Target(context.Background(), ip, false)
		var te *TargetError
		if !errors.As(err, &te) || !errors.Is(err, ErrDenied) {
			t.Errorf("%s: err = %v, want a refusal", ip, err)
			continue
		}
		if !strings.Contains(strings.ToLower(te.Reason), strings.ToLower(want)) {
			t.Errorf("%s: reason %q, want it to say %q", ip, te.Reason, want)
		}
	}
	// A registered server is refused at a special address too: provider
	// listings and inventories are input.
	for _, ip := range []string{"127.0.0.1", "169.254.169.254", "::1", "0.0.0.0", "192.0.2.10"} {
		if err := a.Target(context.Background(), ip, true); !errors.Is(err, ErrDenied) {
			t.Errorf("registered server at %s allowed: %v", ip, err)
		}
	}
	if err := a.Target(context.Background(), "203.0.113.9", true); err != nil {
		t.Errorf("registered server refused: %v", err)
	}
	// SPECIAL_ALLOW_NETWORKS lets test targets through, never metadata.
	b := newAuthorizer(t, Config{Special: SpecialConfig{AllowNetworks: []string{"127.0.0.0/8", "169.254.0.0/16"}}}, "127.0.0.1/8")
	if err := b.Target(context.Background(), "127.0.0.1", true); err != nil {
		t.Errorf("allow-listed registered loopback server refused: %v", err)
	}
	if err := b.Target(context.Background(), "127.0.0.1", false); !errors.Is(err, ErrDenied) {
		t.Errorf("unregistered loopback allowed outside DEPLOY_ALLOW_NETWORKS: %v", err)
	}
	if err := b.Target(context.Background(), "169.254.169.254", true); !errors.Is(err, ErrDenied) {
		t.Errorf("metadata allowed by SPECIAL_ALLOW_NETWORKS: %v", err)
	}
}

func TestTargetDefaultIsRegisteredOnly(t *testing.T) {
	a := newAuthorizer(t, Config{}, "127.0.0.1/8")
	for _, ip := range []string{"203.0.113.9", "8.8.8.8", "2001:db8::1"} {
		if err := a.Target(context.Background(), ip, false); !errors.Is(err, ErrDenied) {
			t.Errorf("%s allowed without an allow-list: %v", ip, err)
		}
	}
	if err := a.Target(context.Background(), "203.0.113.9", true); err != nil {
		t.Errorf("registered: %v", err)
	}
	b := newAuthorizer(t, Config{AllowNetworks: []string{"203.0.113.0/25", "198.51.100.7"}})
	for ip, ok := range map[string]bool{"203.0.113.1": true, "203.0.113.200": false, "198.51.100.7": true, "198.51.100.8": false} {
		if err := b.Target(context.Background(), ip, false); (err == nil) != ok {
			t.Errorf("%s: err = %v, want allowed %v", ip, err, ok)
		}
	}
}

func TestTargetFailsClosedWithoutInterfaces(t *testing.T) {
	a, err := New(Config{AllowNetworks: []string{"0.0.0.0/0"}}, Options{InterfaceAddrs: func() ([]net.Addr, error) {
		return nil, errors.New("netlink: permission denied")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Target(context.Background(), "203.0.113.9", false); !errors.Is(err, ErrDenied) {
		t.Fatalf("err = %v, want a refusal when the host's addresses are unknown", err)
	}
}

func TestUnreachableMessageIsGeneric(t *testing.T) {
	if got := UnreachableMessage("2001:db8::1", 22); got != "[2001:db8::1]:22 did not answer SSH" {
		t.Fatalf("got %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []Config{
		{AllowNetworks: []string{"nonsense"}},
		{AllowNetworks: []string{"10.0.0.0/33"}},
		{Special: SpecialConfig{AllowNetworks: []string{"127.0.0.0/40"}}},
		{SecretRefs: []string{"s3:bucket/x"}},
		{SecretRefs: []string{"vault:secret"}},
		{SecretRefs: []string{"vault:**"}},
		{SecretRefs: []string{"vault:secret/**/x"}},
		{SecretRefs: []string{"vault:secret/a**"}},
		{SecretRefs: []string{"vault:secret/p?version=2"}},
		{SecretRefs: []string{"env:A/B"}},
		{SecretRefs: []string{"env:AUTOPROV_**"}},
		{SecretRefs: []string{"file:../x"}},
		{SecretRefs: []string{"vault:secret/a b"}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	good := Config{AllowNetworks: []string{"203.0.113.0/24", "2001:db8::/32", "198.51.100.7"},
		SecretRefs: []string{"vault:secret/projects/{project_id}/**", "vault:secret/shared/github#token",
			"env:AUTOPROV_PROJECT_{PROJECT_ID}_*", "file:projects/{project_id}/*"}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
}
