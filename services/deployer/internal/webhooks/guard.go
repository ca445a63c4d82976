package webhooks

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// RefusedError says that a webhook address is not allowed.
type RefusedError struct {
	Addr   netip.Addr
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("address %s refused: %s (allow it with WEBHOOK_ALLOW_CIDRS)", e.Addr, e.Reason)
}

// blocked are the ranges refused besides what netip's predicates catch
// (loopback, private, link-local, multicast, unspecified).
var blocked = []struct {
	prefix netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (carrier-grade NAT, some cloud metadata)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved address"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation address"},
	{netip.MustParsePrefix("100::/64"), "discard-only address"},
}

// Guard decides which addresses webhooks may connect to.
type Guard struct {
	allow []netip.Prefix
}

// NewGuard returns a Guard that refuses non-public addresses except those
// in allow.
func NewGuard(allow []netip.Prefix) *Guard { return &Guard{allow: allow} }

// ParseCIDRs parses a list of CIDR prefixes (or single addresses).
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address or CIDR prefix", s)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address or CIDR prefix", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Check returns nil when addr may be connected to, else a *RefusedError.
func (g *Guard) Check(addr netip.Addr) error {
	addr = addr.Unmap()
	for _, p := range g.allow {
		if p.Contains(addr) {
			return nil
		}
	}
	if reason := refusal(addr); reason != "" {
		return &RefusedError{Addr: addr, Reason: reason}
	}
	return nil
}

func refusal(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "invalid address"
	case a.IsLoopback():
		return "loopback address"
	case a.IsUnspecified():
		return "unspecified address"
	case a.IsLinkLocalUnicast():
		return "link-local address (cloud metadata lives here)"
	case a.IsPrivate():
		return "private address"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast address"
	case a == netip.MustParseAddr("255.255.255.255"):
		return "broadcast address"
	}
	for _, b := range blocked {
		if b.prefix.Contains(a) {
			return b.reason
		}
	}
	// IPv6 forms that embed an IPv4 address: NAT64 (64:ff9b::/96) and 6to4
	// (2002::/16) reach the embedded address, so it is checked too.
	if a.Is6() {
		b := a.As16()
		switch {
		case netip.MustParsePrefix("64:ff9b::/96").Contains(a):
			if r := refusal(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
				return "NAT64 form of a " + r
			}
		case netip.MustParsePrefix("2002::/16").Contains(a):
			if r := refusal(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})); r != "" {
				return "6to4 form of a " + r
			}
		}
	}
	return ""
}

// control is a net.Dialer Control function: it runs after name resolution,
// before connect(2), with the address about to be dialled.
func (g *Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook dial: unexpected address %q", address)
	}
	return g.Check(ap.Addr())
}

// ClientOptions configure NewClient.
type ClientOptions struct {
	// Timeout bounds a whole request, response included. Default 10s.
	Timeout time.Duration
	// Resolver resolves host names; nil means the system's.
	Resolver *net.Resolver
}

// NewClient returns an HTTP client for webhooks: every connection is
// checked by the guard at connect time, no proxy is used, redirects are not
// followed (the 3xx response is the attempt's outcome), and requests time out.
func (g *Guard) NewClient(o ClientOptions) *http.Client {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	dialer := &net.Dialer{
		Timeout:   min(o.Timeout, 5*time.Second),
		KeepAlive: 30 * time.Second,
		Resolver:  o.Resolver,
		Control:   g.control,
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   min(o.Timeout, 5*time.Second),
		ResponseHeaderTimeout: o.Timeout,
		MaxIdleConns:          32,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       60 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   o.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// RedactURL returns the scheme, host and port of a callback URL, for
// display: paths and queries of webhook URLs often hold the receiver's
// tokens.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid)"
	}
	out := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		out += "/..."
	}
	return out
}

// MaxURLLen is the longest callback URL accepted.
const MaxURLLen = 2048

// CheckURL validates a callback URL when a request gives it: http or
// https, a host, no credentials, no fragment, a port in range. Two kinds
// of host are checked at once, without any DNS query: an address literal
// (refused when the guard refuses the address) and localhost or a name
// under .localhost (which always mean this machine: refused unless the
// allow-list holds 127.0.0.1 or ::1). Any other host name is accepted
// here and resolved and checked at each attempt (see NewClient). A
// refusal names WEBHOOK_ALLOW_CIDRS, never the address.
func (g *Guard) CheckURL(raw string) error {
	if len(raw) > MaxURLLen {
		return fmt.Errorf("must be at most %d bytes", MaxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("must be an absolute http or https URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("must be an absolute http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("must have a host")
	case u.User != nil:
		return errors.New("must not hold credentials (user:password@)")
	case u.Fragment != "":
		return errors.New("must not have a fragment")
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 {
			return errors.New("must have a port between 1 and 65535")
		}
	}
	host := strings.TrimSuffix(strings.Trim(u.Hostname(), "[]"), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return errors.New("must not have an IPv6 zone")
		}
		var refused *RefusedError
		if err := g.Check(a); errors.As(err, &refused) {
			return refusedURL(refused.Reason)
		}
	} else if isLocalhost(host) {
		if g.Check(netip.MustParseAddr("127.0.0.1")) != nil && g.Check(netip.IPv6Loopback()) != nil {
			return refusedURL("localhost is a loopback address")
		}
	}
	return nil
}

// refusedURL is CheckURL's refusal of a non-public host, saying how an
// operator allows it.
func refusedURL(reason string) error {
	return fmt.Errorf("refused: %s; webhooks reach such addresses only when the deployer's WEBHOOK_ALLOW_CIDRS allows them", reason)
}

// isLocalhost reports whether host (without brackets or port) is
// localhost or a name under .localhost (RFC 6761: always loopback).
func isLocalhost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}
