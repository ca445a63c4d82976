package detect

import "hash/maphash"

// ownerManual is the owner of manual servers' handles in the snapshot's
// claims (fleet.Snapshot.Claim); detectors are their index.
const ownerManual = 32766

// claims are the addresses (with SSH port) the sources claimed so far in a
// tick, in precedence order (handles are claimed in the fleet's snapshot).
// Keys are two independent 64-bit hashes (a chance of about 2^-128 that two
// differ and collide), so the map holds no strings: at a million servers it
// is about 30 MB the garbage collector need not walk. It is cleared, not
// reallocated, from tick to tick.
type claims struct {
	seeds     [2]maphash.Seed
	addresses map[[2]uint64]struct{}
}

func newClaims() claims {
	return claims{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		addresses: map[[2]uint64]struct{}{}}
}

func (c *claims) reset() { clear(c.addresses) }

// addressKey mixes the port into both hashes of the address: two
// endpoints with the same address differ in both words.
func (c *claims) addressKey(a string, port int) [2]uint64 {
	p := uint64(port) + 1
	return [2]uint64{maphash.String(c.seeds[0], a) + p*0x9e3779b97f4a7c15, maphash.String(c.seeds[1], a) ^ p*0xc2b2ae3d27d4eb4f}
}

// claimAddress claims the address and port unless they were claimed
// before, and reports whether they were.
func (c *claims) claimAddress(a string, port int) (taken bool) { return c.claim(c.addressKey(a, port)) }

// claim claims an endpoint by its key (addressKey): one map assignment,
// not a lookup and an assignment (at a million servers, each is a cache
// miss).
func (c *claims) claim(k [2]uint64) (taken bool) {
	n := len(c.addresses)
	c.addresses[k] = struct{}{}
	return len(c.addresses) == n
}
