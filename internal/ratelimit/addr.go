package ratelimit

import "net/netip"

// AddrKey is the key of a client address for a per-address limit: an IPv4
// address as it is, an IPv6 address as its /64. One subscriber, one host,
// commonly holds a whole /64 (SLAAC, privacy addresses, a hosting
// provider's allocation) and can pick any of its 2^64 addresses per
// request: keyed on the full address, each request would find a fresh
// bucket. An IPv4-mapped IPv6 address (::ffff:192.0.2.1, what a dual-stack
// socket reports) is its IPv4 address, and a zone is dropped. Text that is
// not an address is its own key.
func AddrKey(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	if a.Is4() {
		return addr // ParseAddr takes dotted decimal only: already canonical
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64) // an IPv6 address always has a /64
	return p.String()
}
