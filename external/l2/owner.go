package l2

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
)

// Owner picks the node that answers for ip among the eligible, live nodes,
// by rendezvous (highest-random-weight) hashing: every node computes the same
// answer from the same set, IPs spread evenly over nodes, and when a node
// leaves only the IPs it owned move. "" when nodes is empty. It is the
// definition; an index that keeps owners as nodes come and go (the hook's)
// must agree with it.
func Owner(ip netip.Addr, nodes []string) string {
	var best string
	var bestW uint64
	for _, n := range nodes {
		w := Weight(ip, n)
		if best == "" || Outranks(w, n, bestW, best) {
			best, bestW = n, w
		}
	}
	return best
}

// Weight is node's rendezvous weight for ip: the first 8 bytes of
// SHA-256(ip, 0, node), big-endian.
func Weight(ip netip.Addr, node string) uint64 {
	var buf [64]byte
	b := buf[:0]
	switch ip = ip.Unmap(); {
	case ip.Is4():
		a := ip.As4()
		b = append(b, a[:]...)
	case ip.Is6():
		a := ip.As16()
		b = append(b, a[:]...)
	}
	b = append(b, 0)
	b = append(b, node...)
	sum := sha256.Sum256(b)
	return binary.BigEndian.Uint64(sum[:8])
}

// Outranks reports whether node a, of weight wa, ranks above node b, of
// weight wb, for the same IP: the higher weight, and between equal weights
// the lower name.
func Outranks(wa uint64, a string, wb uint64, b string) bool {
	return wa > wb || wa == wb && a < b
}
