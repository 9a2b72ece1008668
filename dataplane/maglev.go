package dataplane

import (
	"net/netip"
	"slices"
)

// Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer", NSDI 2016): a lookup table of a prime
// number of slots, each holding an endpoint, that a hash of the flow's
// 5-tuple indexes. The table is a function of the set of endpoints alone,
// so every node that has the same endpoints builds the same table and sends
// the same flow to the same endpoint; and removing one endpoint of N moves
// little more than its own 1/N of the slots.

// maglevSizes are the table sizes, primes, smallest first. A table of M
// slots gives each of N endpoints M/N slots, give or take one, and keeps
// the flows that move when one endpoint goes near 1/N the larger M/N is;
// its cost is M map elements on every node. The size is the first prime
// of this list with at least 100 slots per endpoint, so that the shares
// differ by at most 1% and the disruption stays near 1/N; past 655
// endpoints it is the last one, with fewer slots each. The steps are
// coarse on purpose: a new size remaps nearly every flow (as a random
// pick would), so a Service's table changes size only when its endpoint
// count crosses 10, 40 or 163, never while it scales within one step.
var maglevSizes = []int{1021, 4093, 16381, 65521}

// maglevSlotsPerEndpoint is the least number of slots per endpoint a table
// size is chosen for.
const maglevSlotsPerEndpoint = 100

// MaglevSize returns the size of the lookup table for n endpoints.
func MaglevSize(n int) int {
	for _, m := range maglevSizes {
		if m >= maglevSlotsPerEndpoint*n {
			return m
		}
	}
	return maglevSizes[len(maglevSizes)-1]
}

// MaglevTable is a Maglev lookup table.
type MaglevTable struct {
	// Endpoints are the distinct endpoints, sorted.
	Endpoints []netip.AddrPort
	// Slots hold, for each slot of the table, the index in Endpoints of the
	// endpoint it sends flows to. Empty when there are no endpoints.
	Slots []int32
}

// NewMaglevTable builds the lookup table of a set of endpoints. It depends
// on the set alone: the order of eps and duplicates in it do not matter,
// and nothing random or local to the process goes into it. When there are
// more endpoints than slots, the last ones in sorted order get none.
func NewMaglevTable(eps []netip.AddrPort) MaglevTable {
	sorted := slices.Clone(eps)
	slices.SortFunc(sorted, netip.AddrPort.Compare)
	sorted = slices.Compact(sorted)
	t := MaglevTable{Endpoints: sorted}
	n := len(sorted)
	if n == 0 {
		return t
	}
	m := MaglevSize(n)
	// Each endpoint's preference list is the permutation
	// offset, offset+skip, offset+2*skip, ... (mod m): m is prime and
	// 0 < skip < m, so it visits every slot once.
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	next := make([]uint64, n) // how far along its list each endpoint is
	for i, ep := range sorted {
		h1, h2 := maglevHashes(ep)
		offset[i] = h1 % uint64(m)
		skip[i] = h2%uint64(m-1) + 1
	}
	t.Slots = make([]int32, m)
	for i := range t.Slots {
		t.Slots[i] = -1
	}
	// The endpoints take turns, each claiming the next free slot of its
	// list, until the table is full: every endpoint ends with m/n slots,
	// rounded down or up.
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for t.Slots[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			t.Slots[c] = int32(i)
			next[i]++
			filled++
		}
	}
	return t
}

// Size is the number of slots.
func (t MaglevTable) Size() int { return len(t.Slots) }

// Endpoint returns the endpoint of slot i.
func (t MaglevTable) Endpoint(i int) netip.AddrPort { return t.Endpoints[t.Slots[i]] }

// maglevHashes are the two hashes an endpoint's permutation is made from:
// FNV-1a (64 bits) of its address (16 bytes, IPv4 mapped) and port, after
// a byte that tells the two apart, each finished with SplitMix64's mixer
// so that endpoints differing in one low bit spread over the whole range.
func maglevHashes(ep netip.AddrPort) (uint64, uint64) {
	var b [19]byte
	a := ep.Addr().Unmap().As16()
	copy(b[1:], a[:])
	b[17], b[18] = byte(ep.Port()>>8), byte(ep.Port())
	b[0] = 1
	h1 := mix64(fnv64a(b[:]))
	b[0] = 2
	h2 := mix64(fnv64a(b[:]))
	return h1, h2
}

func fnv64a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// mix64 is SplitMix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
