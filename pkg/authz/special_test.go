package authz

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestGuardClasses(t *testing.T) {
	g, err := NewGuard(SpecialConfig{}, Options{InterfaceAddrs: fakeIfaces("127.0.0.1/8", "::1/128", "192.0.2.10/24")})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{
		"127.0.0.1":              ClassLoopback,
		"::1":                    ClassLoopback,
		"localhost":              ClassLoopback,
		"db.localhost.":          ClassLoopback,
		"0.0.0.0":                ClassUnspecified,
		"::":                     ClassUnspecified,
		"169.254.169.254":        ClassMetadata,
		"::ffff:169.254.169.254": ClassMetadata,
		"fd00:ec2::254":          ClassMetadata,
		"fd20:ce::254":           ClassMetadata,
		"100.100.100.200":        ClassMetadata,
		"64:ff9b::a9fe:a9fe":     ClassMetadata,
		"169.254.1.1":            ClassLinkLocal,
		"fe80::1":                ClassLinkLocal,
		"fe80::1%eth0":           ClassInvalid,
		"0x7f000002":             ClassInvalid, // 127.0.0.2 to inet_aton, never sent to DNS
		"2130706434":             ClassInvalid,
		"0177.0.0.2":             ClassInvalid,
		"127.2":                  ClassInvalid,
		"127.0.0.02":             ClassInvalid,
		"0X7F.1":                 ClassInvalid,
		"1.2.3.4.":               ClassInvalid,
		"web.0x":                 ClassInvalid,
		"224.0.0.1":              ClassMulticast,
		"ff02::1":                ClassMulticast,
		"255.255.255.255":        ClassBroadcast,
		"192.0.2.255":            ClassBroadcast,
		"240.0.0.1":              ClassReserved,
		"192.0.2.10":             ClassOwnAddress,
	} {
		var ae *AddressError
		if err := g.Check(addr); !errors.As(err, &ae) || !errors.Is(err, ErrDenied) || ae.Class != want {
			t.Errorf("%s: %v, want class %s", addr, err, want)
		}
	}
	for _, ok := range []string{"203.0.113.7", "2001:db8::1", "web-1.example.com", "198.51.100.2", "1e100.net", "web-2", "0xweb.example", "123.example"} {
		if err := g.Check(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
}

func TestGuardAllowList(t *testing.T) {
	g, err := NewGuard(SpecialConfig{AllowNetworks: []string{"127.0.0.0/8", "169.254.0.0/16", "::1", "fd00::/8"}},
		Options{InterfaceAddrs: fakeIfaces("127.0.0.1/8", "::1/128")})
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"127.0.0.1", "127.3.2.1", "::1", "localhost", "169.254.1.1"} {
		if err := g.Check(ok); err != nil {
			t.Errorf("%s refused despite the allow-list: %v", ok, err)
		}
	}
	// Metadata services stay refused inside an allowed network (a VPC's
	// ULA range holds Google Cloud's IPv6 one).
	for _, bad := range []string{"169.254.169.254", "0.0.0.0", "fe80::1", "fd00:ec2::254", "fd20:ce::254"} {
		if err := g.Check(bad); !errors.Is(err, ErrDenied) {
			t.Errorf("%s allowed: %v", bad, err)
		}
	}
}

func TestGuardCheckHostResolves(t *testing.T) {
	g, err := NewGuard(SpecialConfig{}, Options{InterfaceAddrs: fakeIfaces(),
		LookupNetIP: func(_ context.Context, _, host string) ([]netip.Addr, error) {
			switch host {
			case "meta.example":
				return []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("169.254.169.254")}, nil
			case "web.example":
				return []netip.Addr{netip.MustParseAddr("203.0.113.1")}, nil
			}
			return nil, errors.New("no such host")
		}})
	if err != nil {
		t.Fatal(err)
	}
	var ae *AddressError
	// A numeric name is refused before any lookup (the fake resolver
	// would answer "no such host", which passes).
	if err := g.CheckHost(context.Background(), "0x7f000002"); !errors.As(err, &ae) || ae.Class != ClassInvalid {
		t.Errorf("0x7f000002: %v, want refused as invalid without a lookup", err)
	}
	if err := g.CheckHost(context.Background(), "meta.example"); !errors.As(err, &ae) || ae.Class != ClassMetadata {
		t.Errorf("meta.example: %v", err)
	}
	for _, ok := range []string{"web.example", "gone.example"} {
		if err := g.CheckHost(context.Background(), ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestCachedInterfaceAddrs(t *testing.T) {
	calls := 0
	list := func() ([]net.Addr, error) {
		calls++
		return []net.Addr{&net.IPNet{IP: net.ParseIP("192.0.2.2"), Mask: net.CIDRMask(24, 32)}}, nil
	}
	cached := cachedInterfaceAddrs(list, time.Hour)
	for range 1000 {
		if a, err := cached(); err != nil || len(a) != 1 {
			t.Fatalf("%v, %v", a, err)
		}
	}
	if calls != 1 {
		t.Fatalf("listed the interfaces %d times for 1000 checks, want once", calls)
	}
	expired := cachedInterfaceAddrs(list, 0)
	calls = 0
	expired()
	expired()
	if calls != 2 {
		t.Fatalf("listed %d times with no ttl, want 2", calls)
	}
}
