package authz

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Classes of the addresses no automation may reach, as the reason label
// of the metrics that count refusals and in AddressError.Class.
const (
	ClassInvalid     = "invalid"     // not an IP address (or one with a zone)
	ClassUnspecified = "unspecified" // 0.0.0.0/8, ::
	ClassLoopback    = "loopback"    // 127.0.0.0/8, ::1, localhost
	ClassLinkLocal   = "link_local"  // 169.254.0.0/16, fe80::/10
	ClassMetadata    = "metadata"    // 169.254.169.254, fd00:ec2::254, fd20:ce::254, 100.100.100.200, 168.63.129.16
	ClassMulticast   = "multicast"   // 224.0.0.0/4, ff00::/8
	ClassBroadcast   = "broadcast"   // 255.255.255.255, the last address of this host's networks
	ClassReserved    = "reserved"    // 240.0.0.0/4, deprecated IPv6 kinds
	ClassOwnAddress  = "own_address" // an address of this host
)

// specialSetting is the variable of SpecialConfig.AllowNetworks.
const specialSetting = "SPECIAL_ALLOW_NETWORKS"

// SpecialConfig is the operator's exception to the refusal of special
// addresses; the scheduler and infra read the same variable.
type SpecialConfig struct {
	AllowNetworks []string `env:"SPECIAL_ALLOW_NETWORKS" envSeparator:"," desc:"networks (CIDR) of special addresses (loopback, link-local, unspecified, multicast, broadcast, this host's own) that may still be servers: for test targets on this machine only, e.g. 127.0.0.0/8 (empty by default; cloud metadata addresses are refused whatever it says)"`
}

// Validate checks the networks.
func (c SpecialConfig) Validate() error {
	_, errs := parseNetworks(specialSetting, c.AllowNetworks)
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// AddressError is an address refused by a Guard.
type AddressError struct {
	Address string
	Class   string // one of the Class constants
	Reason  string // for the operator's log
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("address %s refused: %s", e.Address, e.Reason)
}

// Unwrap returns ErrDenied.
func (e *AddressError) Unwrap() error { return ErrDenied }

// Guard refuses the special addresses: loopback, unspecified, link-local,
// cloud metadata, multicast, broadcast, reserved and this host's own
// addresses. Provider listings, inventories and requests are input: a
// server at one of them would turn the service against the machine it
// runs on or its cloud's metadata. Networks of SpecialConfig are let
// through (test targets on loopback), cloud metadata addresses never.
// It is safe for concurrent use.
type Guard struct {
	allow   []netip.Prefix
	ifaddrs func() ([]net.Addr, error)
	lookup  func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// NewGuard validates cfg and returns its Guard. Of opts, InterfaceAddrs
// (this host's addresses) and LookupNetIP (for CheckHost) are used.
func NewGuard(cfg SpecialConfig, opts Options) (*Guard, error) {
	nets, errs := parseNetworks(specialSetting, cfg.AllowNetworks)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	if opts.InterfaceAddrs == nil {
		opts.InterfaceAddrs = cachedInterfaceAddrs(net.InterfaceAddrs, ownAddressesTTL)
	}
	if opts.LookupNetIP == nil {
		opts.LookupNetIP = net.DefaultResolver.LookupNetIP
	}
	return &Guard{allow: nets, ifaddrs: opts.InterfaceAddrs, lookup: opts.LookupNetIP}, nil
}

// Check refuses address when it is an IP address of a special kind, or a
// name of this host (localhost, *.localhost), with an *AddressError.
// Other host names pass: they are not resolved here (CheckHost does).
func (g *Guard) Check(address string) error {
	if err := g.check(address); err != nil {
		return err
	}
	return nil
}

func (g *Guard) check(address string) *AddressError {
	if ip, err := netip.ParseAddr(address); err == nil {
		return g.checkIP(address, ip)
	}
	if strings.Contains(address, ":") || strings.Contains(address, "%") {
		return &AddressError{Address: address, Class: ClassInvalid, Reason: "not an IP address without a zone"}
	}
	if EndsInNumber(address) {
		return &AddressError{Address: address, Class: ClassInvalid, Reason: NumericNameReason}
	}
	name := strings.ToLower(strings.TrimSuffix(address, "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		if !g.allowed(netip.IPv6Loopback()) && !g.allowed(netip.AddrFrom4([4]byte{127, 0, 0, 1})) {
			return &AddressError{Address: address, Class: ClassLoopback, Reason: "a name of this host (localhost)"}
		}
	}
	return nil
}

// CheckHost is Check, and for a host name it also checks every address the
// name resolves to now. A name that does not resolve passes: nothing can
// be dialled at it either.
func (g *Guard) CheckHost(ctx context.Context, address string) error {
	if err := g.check(address); err != nil {
		return err
	}
	if _, err := netip.ParseAddr(address); err == nil {
		return nil
	}
	ips, err := g.lookup(ctx, "ip", address)
	if err != nil {
		return nil
	}
	for _, ip := range ips {
		if e := g.checkIP(address, ip); e != nil {
			e.Reason = fmt.Sprintf("resolves to %s, %s", ip.Unmap(), e.Reason)
			return e
		}
	}
	return nil
}

// checkIP checks one IP address (spelled address).
func (g *Guard) checkIP(address string, ip netip.Addr) *AddressError {
	if ip.Zone() != "" {
		return &AddressError{Address: address, Class: ClassInvalid, Reason: "not an IP address without a zone"}
	}
	ip = ip.Unmap()
	class, reason := neverAllowed(ip)
	if class == ClassMetadata {
		return &AddressError{Address: address, Class: class, Reason: reason}
	}
	if g.allowed(ip) {
		return nil
	}
	if class == "" {
		class, reason = ownAddress(g.ifaddrs, ip)
	}
	if class != "" {
		return &AddressError{Address: address, Class: class, Reason: reason}
	}
	return nil
}

func (g *Guard) allowed(ip netip.Addr) bool {
	for _, n := range g.allow {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// ownAddressesTTL is how long the Guard keeps this host's addresses: a
// source of 100,000 servers is checked in one sync, and listing the
// interfaces for each address (a system call, about 80 µs) made a tick
// eight times slower (BenchmarkTick).
const ownAddressesTTL = 5 * time.Second

// cachedInterfaceAddrs returns list, answered from a copy at most ttl old.
// An error is not kept: the next call lists again.
func cachedInterfaceAddrs(list func() ([]net.Addr, error), ttl time.Duration) func() ([]net.Addr, error) {
	var (
		mu    sync.Mutex
		addrs []net.Addr
		at    time.Time
	)
	return func() ([]net.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		if addrs != nil && time.Since(at) < ttl {
			return addrs, nil
		}
		a, err := list()
		if err != nil {
			return nil, err
		}
		addrs, at = a, time.Now()
		return addrs, nil
	}
}

// NumericNameReason says why a name that EndsInNumber is refused.
const NumericNameReason = "a number, not an IPv4 address in dotted-decimal form (a.b.c.d): " +
	"forms such as 0x7f000001, 2130706433, 0177.0.0.1 or 127.1 are refused"

// EndsInNumber reports whether a host name's last label (a trailing dot
// aside) is a number: decimal digits, or 0x and hex digits. No DNS name
// ends so (no top-level domain is numeric), while the resolvers of the C
// library, and so ssh and Python, read such a name as an IPv4 address in
// another form (inet_aton: 0x7f000001, 2130706433, 0177.0.0.1 and 127.1
// are all 127.0.0.1): a guard that resolved it through DNS would pass an
// address the connection then reaches. It is the WHATWG URL standard's
// rule for hosts; such a name is refused before any lookup, a canonical
// IPv4 literal being parsed as an address first.
func EndsInNumber(name string) bool {
	name = strings.TrimSuffix(name, ".")
	last := name[strings.LastIndexByte(name, '.')+1:]
	if last == "" {
		return false
	}
	digits := "0123456789"
	if h, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		last, digits = h, "0123456789abcdef"
		if last == "" {
			return true // "0x" alone is the number 0
		}
	}
	return strings.Trim(last, digits) == ""
}
