package sources

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// pin checks the addresses of rawURL's host with the guard (none: no
// check) and returns the git configuration that pins git's connection to
// them (curl's CURLOPT_RESOLVE).
func (c *Cache) pin(ctx context.Context, rawURL string) ([][2]string, error) {
	if c.guard == nil {
		return nil, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: not a URL", ErrURL)
	}
	host := u.Hostname()
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	if err := c.guard.Check(host); err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		if addrs, err = c.lookup(ctx, "ip", host); err != nil || len(addrs) == 0 {
			return nil, fmt.Errorf("%w: resolve %s: %v", ErrFetch, host, err)
		}
	}
	spelled := make([]string, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if err := c.guard.Check(a.String()); err != nil {
			return nil, fmt.Errorf("repository %s: %w", host, err)
		}
		if a.Is6() {
			spelled = append(spelled, "["+a.String()+"]")
		} else {
			spelled = append(spelled, a.String())
		}
	}
	if strings.Contains(host, ":") { // an IPv6 literal: nothing to resolve
		return nil, nil
	}
	return [][2]string{{"http.curloptResolve", host + ":" + port + ":" + strings.Join(spelled, ",")}}, nil
}
