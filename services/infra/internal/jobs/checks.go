package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
//
// With a shared record (Config.SSHCheckShared), a pass is also written to
// Redis under a key naming the endpoint, holding when it passed and a hash
// of the pinned host key and client keys, expiring after the window; a
// forget deletes it. A run on another replica then reuses it under the same
// rules (back-to-back jobs of one server on different replicas), and a
// failure on any replica makes every replica check again. A record that
// cannot be read counts as none: the run checks.
type passedChecks struct {
	window time.Duration         // 0: never reuse
	rdb    redis.UniversalClient // the shared record; nil: this process only

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

func newPassedChecks(window time.Duration, shared redis.UniversalClient) *passedChecks {
	return &passedChecks{window: window, rdb: shared, passed: map[endpointKey]passedCheck{}}
}

// sharedKeyPrefix starts the Redis keys of shared passed checks.
const sharedKeyPrefix = "autoprov:infra:ssh-check:"

// sharedKey is the Redis key of k's shared record: a hash, so no address
// or user is spelled out in Redis.
func (k endpointKey) sharedKey() string {
	sum := sha256.Sum256([]byte(k.address + "\x00" + strconv.Itoa(k.port) + "\x00" + k.user))
	return sharedKeyPrefix + hex.EncodeToString(sum[:16])
}

// proof is what a passed check held, as stored in the shared record.
func proof(hostKey, clients string) string {
	sum := sha256.Sum256([]byte(keyLine(hostKey) + "\x00" + clients))
	return hex.EncodeToString(sum[:16])
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
func (p *passedChecks) reuse(ctx context.Context, k endpointKey, hostKey, clients string, now time.Time) (time.Duration, bool) {
	if p.window <= 0 || hostKey == "" {
		return 0, false
	}
	p.mu.Lock()
	c, ok := p.passed[k]
	p.mu.Unlock()
	if ok {
		ago := now.Sub(c.at)
		if ago >= 0 && ago <= p.window && c.hostKey == keyLine(hostKey) && c.clients == clients {
			return ago, true
		}
	}
	return p.reuseShared(ctx, k, hostKey, clients, now)
}

// reuseShared looks for a shared record of k (see passedChecks).
func (p *passedChecks) reuseShared(ctx context.Context, k endpointKey, hostKey, clients string, now time.Time) (time.Duration, bool) {
	if p.rdb == nil {
		return 0, false
	}
	v, err := p.rdb.Get(ctx, k.sharedKey()).Result()
	if err != nil {
		return 0, false
	}
	at, hash, ok := strings.Cut(v, " ")
	ms, perr := strconv.ParseInt(at, 10, 64)
	if !ok || perr != nil || hash != proof(hostKey, clients) {
		return 0, false
	}
	ago := now.Sub(time.UnixMilli(ms))
	if ago < 0 || ago > p.window {
		return 0, false
	}
	return ago, true
}

// pass records that a check of k passed at now.
func (p *passedChecks) pass(ctx context.Context, k endpointKey, hostKey, clients string, now time.Time) {
	if p.window <= 0 || hostKey == "" {
		return
	}
	if p.rdb != nil {
		// Best effort: without the record, other replicas check.
		_ = p.rdb.Set(ctx, k.sharedKey(), strconv.FormatInt(now.UnixMilli(), 10)+" "+proof(hostKey, clients), p.window).Err()
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
func (p *passedChecks) forget(ctx context.Context, k endpointKey) {
	p.mu.Lock()
	delete(p.passed, k)
	p.mu.Unlock()
	if p.rdb != nil {
		_ = p.rdb.Del(context.WithoutCancel(ctx), k.sharedKey()).Err()
	}
}

// keyLine is an authorized_keys line reduced to "type base64".
func keyLine(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return line
	}
	return f[0] + " " + f[1]
}
