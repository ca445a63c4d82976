package store

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// ErrInvalidAddress: a server address is neither an IP address nor a host
// name in a form the store accepts (see CanonicalAddress).
var ErrInvalidAddress = errors.New("invalid server address")

var (
	hostnameRE = pattern.MustCompileParts(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`, ".", 63)
	// numericLabelRE is a last label that inet_aton(3) (and with it ssh's
	// resolver) reads as a number: "10.1" or "0x7f000001" would name an
	// IP address while looking like a host name.
	numericLabelRE = regexp.MustCompile(`^([0-9]+|0x[0-9a-f]*)$`)
	// ipv4CompatPrefix holds the deprecated IPv4-compatible IPv6 addresses
	// (::a.b.c.d): refused, they have no canonical form the database and Go
	// agree on, and nothing legitimate uses them.
	ipv4CompatPrefix = netip.MustParsePrefix("::/96")
)

// CanonicalAddress returns the one form in which the store keeps, compares
// and locks a server address, so that every spelling of the same host
// finds the same row, the same pinned host key and the same lock:
//
//   - an IPv4 address in dotted decimal ("192.0.2.1");
//   - an IPv4-mapped IPv6 address unmapped to its IPv4 address
//     ("::ffff:192.0.2.1" and "::ffff:c000:201" become "192.0.2.1");
//   - an IPv6 address in its RFC 5952 form ("fd00:5ec:0:0::2" becomes
//     "fd00:5ec::2", "2001:DB8::1" becomes "2001:db8::1");
//   - a host name in lower case without a trailing dot.
//
// Refused, with ErrInvalidAddress: zones ("fe80::1%eth0"), prefixes,
// ports, white space, IPv4-compatible IPv6 addresses ("::192.0.2.1"),
// IPv4 addresses with leading zeros, and names whose last label is a
// number ("10.1", "0x7f000001": the C resolver reads them as IP addresses).
// The database applies the same rules (autoprov_canonical_address in
// migration 00010): a trigger stores every address in this form and a check
// refuses any other.
func CanonicalAddress(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidAddress)
	}
	if strings.Contains(s, ":") {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return "", fmt.Errorf("%w: %q is not an IPv6 address without a zone", ErrInvalidAddress, s)
		}
		return canonicalIP(s, ip)
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return canonicalIP(s, ip)
	}
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if len(h) > 253 || !hostnameRE.MatchString(h) {
		return "", fmt.Errorf("%w: %q is neither an IP address nor a host name", ErrInvalidAddress, s)
	}
	if numericLabelRE.MatchString(h[strings.LastIndexByte(h, '.')+1:]) {
		return "", fmt.Errorf("%w: %q looks like a number, not a host name (write an IP address in dotted decimal)", ErrInvalidAddress, s)
	}
	return h, nil
}

func canonicalIP(s string, ip netip.Addr) (string, error) {
	ip = ip.Unmap()
	if ip.Is6() && ipv4CompatPrefix.Contains(ip) && ip != netip.IPv6Unspecified() && ip != netip.IPv6Loopback() {
		return "", fmt.Errorf("%w: %q is an IPv4-compatible IPv6 address (deprecated): write the IPv4 address", ErrInvalidAddress, s)
	}
	return ip.String(), nil
}

// AddressTarget returns the run lock key (runs.target) of a run on an SSH
// endpoint that is no registered server: "address:", the canonical address
// and the port (0: 22), as host:port, so that every spelling of one
// endpoint takes the same lock while hosts behind one address (port
// forwarding, NAT, containers) each have their own.
func AddressTarget(address string, port int) (string, error) {
	c, err := CanonicalAddress(address)
	if err != nil {
		return "", err
	}
	if port == 0 {
		port = 22
	}
	return "address:" + net.JoinHostPort(c, strconv.Itoa(port)), nil
}
