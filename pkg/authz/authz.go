// Package authz decides who may use which secret on which host: where a
// deploy request may send the secrets it names, and which secret
// references a request of a project may name at all. The infra service
// asks it before it resolves a secret or opens a connection, so a refusal
// never sends a packet and never reads a secret.
//
// Two rules (docs/secrets.md, "Authorization"):
//
//   - Targets: a deploy goes to a registered server, or to an unregistered
//     address only inside the operator's allow-list of networks
//     (DEPLOY_ALLOW_NETWORKS, empty by default); no run, to a registered
//     server or not, goes to a loopback, unspecified, link-local,
//     multicast, broadcast or reserved address, a cloud metadata address,
//     or an address of this host (Guard; SPECIAL_ALLOW_NETWORKS lets test
//     targets through, metadata never). A refused deploy target gets the
//     same result as a target that does not answer (UnreachableMessage),
//     so the service cannot be used to probe networks.
//   - References: a request of project P may name only references that
//     match one of the operator's templates (DEPLOY_SECRET_REFS, by default
//     vault:secret/projects/{project_id}/**) with {project_id} set to P, and
//     never one naming the service's own credentials (its SSH keys).
package authz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Config is the operator's policy, read from the environment (caarlos0/env
// tags; desc is the --help line).
type Config struct {
	// Special lets test targets at special addresses through (both
	// services read it: SPECIAL_ALLOW_NETWORKS).
	Special       SpecialConfig
	AllowNetworks []string `env:"DEPLOY_ALLOW_NETWORKS" envSeparator:"," desc:"networks (CIDR) an unregistered deploy target may be in, e.g. 203.0.113.0/24 (empty: deploys go to registered servers only; loopback, link-local, multicast, broadcast and this host's addresses are refused whatever it says)"`
	// Pools grants the Ansible job pools to projects (pools.go).
	Pools      PoolConfig
	SecretRefs []string `env:"DEPLOY_SECRET_REFS" envSeparator:"," envDefault:"vault:secret/projects/{project_id}/**" desc:"templates of the secret references a deploy may name: {project_id} is the request's project, * one path segment (or part of one), ** the rest of the path, #field limits the field"`
}

// Validate checks the networks and templates.
func (c Config) Validate() error {
	_, err := parseConfig(c)
	return err
}

type parsed struct {
	nets      []netip.Prefix
	templates []template
}

func parseConfig(c Config) (parsed, error) {
	var p parsed
	nets, errs := parseNetworks("DEPLOY_ALLOW_NETWORKS", c.AllowNetworks)
	p.nets = nets
	if _, err := c.Pools.Pools(); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseNetworks(specialSetting, c.Special.AllowNetworks); err != nil {
		errs = append(errs, err...)
	}
	for _, s := range c.SecretRefs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		t, err := parseTemplate(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("DEPLOY_SECRET_REFS: %w", err))
			continue
		}
		p.templates = append(p.templates, t)
	}
	return p, errors.Join(errs...)
}

// parseNetworks reads a list of networks (CIDR, or single addresses) of
// the setting name.
func parseNetworks(name string, list []string) ([]netip.Prefix, []error) {
	var nets []netip.Prefix
	var errs []error
	for _, n := range list {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(n)
		if err != nil {
			// A single address is a /32 or /128 network.
			if a, aerr := netip.ParseAddr(n); aerr == nil && a.Zone() == "" {
				pfx = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
				err = nil
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a network (CIDR) or address", name, n))
			continue
		}
		if pfx.Addr().Is4In6() {
			if pfx.Bits() < 96 {
				errs = append(errs, fmt.Errorf("%s: %q: write IPv4 networks in IPv4 form", name, n))
				continue
			}
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		nets = append(nets, pfx.Masked())
	}
	return nets, errs
}

// Options are the Authorizer's dependencies; the zero value works.
type Options struct {
	// InterfaceAddrs lists this host's addresses (net.InterfaceAddrs when
	// nil); they are read at every decision, as they may change.
	InterfaceAddrs func() ([]net.Addr, error)
	// LookupNetIP resolves the host name of a registered server
	// (net.DefaultResolver.LookupNetIP when nil).
	LookupNetIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Authorizer applies a Config. It is safe for concurrent use.
type Authorizer struct {
	nets      []netip.Prefix
	templates []template
	guard     *Guard
}

// New validates cfg and returns its Authorizer.
func New(cfg Config, opts Options) (*Authorizer, error) {
	p, err := parseConfig(cfg)
	if err != nil {
		return nil, err
	}
	g, err := NewGuard(cfg.Special, opts)
	if err != nil {
		return nil, err
	}
	return &Authorizer{nets: p.nets, templates: p.templates, guard: g}, nil
}

// Guard returns the special-address check the Authorizer applies.
func (a *Authorizer) Guard() *Guard { return a.guard }

// ErrDenied is wrapped by every refusal of this package.
var ErrDenied = errors.New("not authorized")

// TargetError is a refused target. Its Error text is for the
// service's log; the requester gets UnreachableMessage only.
type TargetError struct {
	Address string
	Reason  string
}

func (e *TargetError) Error() string {
	return fmt.Sprintf("target %s refused: %s", e.Address, e.Reason)
}

// Unwrap returns ErrDenied.
func (e *TargetError) Unwrap() error { return ErrDenied }

// UnreachableMessage is what a requester is told about an unregistered
// target that was refused or did not answer: the same words either way,
// without the reason or the connection error, so that the service reveals
// nothing about networks it may not reach.
func UnreachableMessage(address string, port int) string {
	return fmt.Sprintf("%s did not answer SSH", net.JoinHostPort(address, fmt.Sprint(port)))
}

// Target decides whether a run may connect to address. No target, not
// even a registered server, is one of the special kinds (see Guard)
// unless SPECIAL_ALLOW_NETWORKS lets it through; a registered server's
// host name is resolved and each of its addresses checked. Beyond that a
// registered server (the operator put it in the fleet) is allowed; any
// other address only when it is an IP address literal in an allowed
// network. The error is a *TargetError.
func (a *Authorizer) Target(ctx context.Context, address string, registered bool) error {
	deny := func(reason string) error { return &TargetError{Address: address, Reason: reason} }
	var ae *AddressError
	if registered {
		if err := a.guard.CheckHost(ctx, address); errors.As(err, &ae) {
			return deny(ae.Reason)
		}
		return nil
	}
	ip, err := netip.ParseAddr(address)
	if err != nil || ip.Zone() != "" {
		return deny("not an IP address without a zone")
	}
	ip = ip.Unmap()
	if err := a.guard.checkIP(address, ip); err != nil {
		return deny(err.Reason)
	}
	for _, n := range a.nets {
		if n.Contains(ip) {
			return nil
		}
	}
	if len(a.nets) == 0 {
		return deny("not a registered server (DEPLOY_ALLOW_NETWORKS is empty)")
	}
	return deny("not a registered server and outside DEPLOY_ALLOW_NETWORKS")
}

// ownAddress says why ip is this host (one of its addresses, or the
// broadcast address of one of its IPv4 networks): its class and the
// reason, or "".
func ownAddress(ifaddrs func() ([]net.Addr, error), ip netip.Addr) (class, reason string) {
	addrs, err := ifaddrs()
	if err != nil {
		// Without the list nothing can be told apart: refuse.
		return ClassOwnAddress, "this host's addresses cannot be listed: " + err.Error()
	}
	for _, ad := range addrs {
		pfx, ok := ifacePrefix(ad)
		if !ok {
			continue
		}
		if pfx.Addr().Unmap() == ip {
			return ClassOwnAddress, "an address of this host"
		}
		if n := pfx.Masked(); ip.Is4() && n.Addr().Is4() && n.Bits() < 31 && n.Contains(ip) && ip == lastAddr(n) {
			return ClassBroadcast, "the broadcast address of this host's network " + n.String()
		}
	}
	return "", ""
}

func ifacePrefix(a net.Addr) (netip.Prefix, bool) {
	switch v := a.(type) {
	case *net.IPNet:
		ip, ok := netip.AddrFromSlice(v.IP)
		if !ok {
			return netip.Prefix{}, false
		}
		ones, _ := v.Mask.Size()
		ip = ip.Unmap()
		if ip.Is4() && ones > 32 {
			ones -= 96
		}
		return netip.PrefixFrom(ip, ones), true
	case *net.IPAddr:
		ip, ok := netip.AddrFromSlice(v.IP)
		if !ok {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()), true
	}
	return netip.Prefix{}, false
}

// lastAddr returns the last address of an IPv4 network (its broadcast).
func lastAddr(n netip.Prefix) netip.Addr {
	b := n.Addr().As4()
	host := uint32(1)<<(32-n.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// rule is a network that is never a target, its class and why.
type rule struct {
	p      netip.Prefix
	class  string
	reason string
}

var (
	never4 = []rule{
		{netip.MustParsePrefix("0.0.0.0/8"), ClassUnspecified, "an unspecified (this-network) address"},
		{netip.MustParsePrefix("127.0.0.0/8"), ClassLoopback, "a loopback address"},
		{netip.MustParsePrefix("169.254.0.0/16"), ClassLinkLocal, "a link-local address (cloud metadata lives there)"},
		{netip.MustParsePrefix("224.0.0.0/4"), ClassMulticast, "a multicast address"},
		{netip.MustParsePrefix("255.255.255.255/32"), ClassBroadcast, "the broadcast address"},
		{netip.MustParsePrefix("240.0.0.0/4"), ClassReserved, "a reserved address"},
	}
	never6 = []rule{
		{netip.MustParsePrefix("::/128"), ClassUnspecified, "the unspecified address"},
		{netip.MustParsePrefix("::1/128"), ClassLoopback, "the loopback address"},
		{netip.MustParsePrefix("::/96"), ClassReserved, "an IPv4-compatible address (deprecated)"},
		{netip.MustParsePrefix("fe80::/10"), ClassLinkLocal, "a link-local address"},
		{netip.MustParsePrefix("fec0::/10"), ClassReserved, "a site-local address (deprecated)"},
		{netip.MustParsePrefix("ff00::/8"), ClassMulticast, "a multicast address"},
	}
	// metadata are cloud instance metadata services outside link-local.
	metadata = map[netip.Addr]string{
		netip.MustParseAddr("fd00:ec2::254"):   "a cloud metadata service (AWS)",
		netip.MustParseAddr("fd20:ce::254"):    "a cloud metadata service (Google Cloud, IPv6)",
		netip.MustParseAddr("100.100.100.200"): "a cloud metadata service (Alibaba)",
		netip.MustParseAddr("168.63.129.16"):   "a cloud platform service (Azure)",
	}
	// metadataV4 is where IPv4 clouds (AWS, GCP, Azure, OpenStack...) serve
	// instance metadata: never a target, whatever an allow-list says.
	metadataV4 = netip.MustParseAddr("169.254.169.254")
	// embedding are IPv6 prefixes whose addresses carry an IPv4 address
	// that a translator may reach (NAT64, 6to4): that address is checked.
	nat64  = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// neverAllowed says why ip may never be a target (its class and the
// reason), or "".
func neverAllowed(ip netip.Addr) (class, reason string) {
	if r, ok := metadata[ip]; ok {
		return ClassMetadata, r
	}
	if ip == metadataV4 {
		return ClassMetadata, "a link-local address (cloud metadata lives there)"
	}
	if ip.Is4() {
		for _, n := range never4 {
			if n.p.Contains(ip) {
				return n.class, n.reason
			}
		}
		return "", ""
	}
	for _, n := range never6 {
		if n.p.Contains(ip) {
			return n.class, n.reason
		}
	}
	b := ip.As16()
	for _, n := range nat64 {
		if n.Contains(ip) {
			if c, r := neverAllowed(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
				return c, "a NAT64 address of " + r
			}
		}
	}
	if sixTo4.Contains(ip) {
		if c, r := neverAllowed(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})); r != "" {
			return c, "a 6to4 address of " + r
		}
	}
	return "", ""
}
