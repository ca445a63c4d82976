package jobs

import (
	"net/netip"
	"strings"
	"sync"
	"time"
)

// passedChecks remembers the SSH checks that passed lately, so that a run to
// the same endpoint moments later goes without a handshake of its own (tens
// of milliseconds against a loaded loopback sshd, a few round trips to a
// remote server). A play that succeeded counts as a check that passed when
// it ended: its ssh reached the server with the same key, holding it to the
// same pinned key.
//
// A check is reused only while all it proved still holds: the same
// endpoint (canonical address, port and user), the same pinned host key,
// the same client keys, and at most the window since it passed. A check
// that failed, or a play that found the server unreachable, forgets the
// endpoint: after a failure the next run always checks.
type passedChecks struct {
	window time.Duration // 0: never reuse

	mu     sync.Mutex
	passed map[endpointKey]passedCheck
}

// endpointKey names an SSH endpoint: the address in canonical form (an IP
// address as netip prints it, IPv4-mapped IPv6 as IPv4; a host name in
// lower case without a final dot), the port (22 for 0) and the user.
type endpointKey struct {
	address string
	port    int
	user    string
}

// passedCheck is an SSH check that passed.
type passedCheck struct {
	at      time.Time
	hostKey string // the pinned host key it held the server to ("type base64")
	clients string // fingerprints of the client keys it authenticated with
}

func newPassedChecks(window time.Duration) *passedChecks {
	return &passedChecks{window: window, passed: map[endpointKey]passedCheck{}}
}

// keyOf returns the endpoint's key.
func keyOf(ep endpoint) endpointKey {
	addr := strings.TrimSuffix(strings.ToLower(ep.address), ".")
	if ip, err := netip.ParseAddr(strings.Trim(ep.address, "[]")); err == nil {
		addr = ip.Unmap().String()
	}
	port := ep.port
	if port == 0 {
		port = 22
	}
	return endpointKey{address: addr, port: port, user: ep.user}
}

// reuse reports whether a check of k passed within the window, holding the
// server to hostKey and authenticating with clients; it returns how long
// ago.
func (p *passedChecks) reuse(k endpointKey, hostKey, clients string, now time.Time) (time.Duration, bool) {
	if p.window <= 0 || hostKey == "" {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.passed[k]
	if !ok {
		return 0, false
	}
	ago := now.Sub(c.at)
	if ago < 0 || ago > p.window || c.hostKey != keyLine(hostKey) || c.clients != clients {
		return 0, false
	}
	return ago, true
}

// pass records that a check of k passed at now.
func (p *passedChecks) pass(k endpointKey, hostKey, clients string, now time.Time) {
	if p.window <= 0 || hostKey == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for other, c := range p.passed { // drop the stale ones: the map stays small
		if now.Sub(c.at) > p.window {
			delete(p.passed, other)
		}
	}
	p.passed[k] = passedCheck{at: now, hostKey: keyLine(hostKey), clients: clients}
}

// forget drops what is known of k: the next run to it checks.
func (p *passedChecks) forget(k endpointKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.passed, k)
}

// keyLine is an authorized_keys line reduced to "type base64".
func keyLine(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return line
	}
	return f[0] + " " + f[1]
}
