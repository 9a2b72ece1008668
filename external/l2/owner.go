package l2

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
)

// Owner picks the node that answers for ip among the eligible, live nodes,
// by rendezvous (highest-random-weight) hashing: every node computes the same
// answer from the same set, IPs spread evenly over nodes, and when a node
// leaves only the IPs it owned move. "" when nodes is empty.
func Owner(ip netip.Addr, nodes []string) string {
	var best string
	var bestW uint64
	b := ip.Unmap().AsSlice()
	for _, n := range nodes {
		h := sha256.New()
		h.Write(b)
		h.Write([]byte{0})
		h.Write([]byte(n))
		w := binary.BigEndian.Uint64(h.Sum(nil))
		if best == "" || w > bestW || w == bestW && n < best {
			best, bestW = n, w
		}
	}
	return best
}
