package nft

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// A chain of a Service port that balances by Maglev picks its endpoint
// from a Maglev lookup table (dataplane.MaglevTable) instead of at random:
//
//	counter dnat ip to numgen random mod 1 offset <id> . jhash ip saddr . th sport . ip daddr . th dport . meta l4proto mod <size> seed <maglevSeed> map @endpoints<f>-<shard>
//
// The endpoint maps hold the table: one element <id> . <slot> per slot,
// each the endpoint of that slot. The table depends on the endpoints
// alone, the hash on the packet and a fixed seed alone, so every node with
// the same endpoints sends a flow to the same one. When an endpoint comes
// or goes, only the slots whose endpoint changed are rewritten (element
// updates, no rule), unless the table's size changes with the endpoint
// count (dataplane.MaglevSize), which rewrites the rule and all slots.
//
// The kernel's jhash reads the registers four bytes at a time in the CPU's
// byte order: nodes of one byte order (x86-64 and arm64 alike are little
// endian) hash alike.

// maglevSeed is the seed of the Maglev chains' jhash. The kernel draws a
// random seed for a hash expression without one: every node would then
// hash differently.
const maglevSeed = 0x6f6e6568

// maglevHashReg is the first register of the 5-tuple the hash reads; the
// hash lands in the slot after the chain id (NFT_REG32_01), so that
// <id> . <slot> is the endpoint map's key in NFT_REG_1.
const maglevHashReg = unix.NFT_REG32_02

// maglevTupleLen is the length of the 5-tuple in the registers: the two
// addresses, and the ports and protocol padded to 4 bytes each.
func maglevTupleLen(f portal.Family) uint32 { return uint32(2*addrLen(f) + 3*4) }

// maglevRule is the rule of a Maglev chain with id whose table has size
// slots.
func maglevRule(f portal.Family, id uint32, size int) []expr.Any {
	al := uint32(addrLen(f) / 4)
	r := uint32(maglevHashReg)
	return cat(matchFamily(f), []expr.Any{
		counter(),
		loadChainID(id),
		loadAddr(f, false, r),
		&expr.Payload{DestRegister: r + al, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		loadAddr(f, true, r+al+1),
		&expr.Payload{DestRegister: r + 2*al + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r + 2*al + 2},
		&expr.Hash{SourceRegister: r, DestRegister: reg32After(4), Length: maglevTupleLen(f),
			Modulus: uint32(size), Seed: maglevSeed, Type: expr.HashTypeJenkins},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setEndpoints(f, id)},
		dnatFrom(f, reg1),
	})
}

// slots are the values of the chain's endpoint-map elements, by index:
// its endpoints for a random pick, the endpoint of each slot of its
// lookup table for Maglev. None for a chain that does not use the maps.
func (b chainBody) slots() []netip.AddrPort {
	if !b.usesEndpointMap() {
		return nil
	}
	if !b.maglev {
		return b.endpoints
	}
	t := dataplane.NewMaglevTable(b.endpoints)
	out := make([]netip.AddrPort, t.Size())
	for i := range out {
		out[i] = t.Endpoint(i)
	}
	return out
}

// tableSize is the modulus of the chain's pick: the number of endpoints,
// or the size of the Maglev table.
func (b chainBody) tableSize() int {
	if b.maglev {
		return dataplane.MaglevSize(distinct(b.endpoints))
	}
	return len(b.endpoints)
}

// distinct counts the distinct endpoints of a list.
func distinct(eps []netip.AddrPort) int {
	sorted := slices.Clone(eps)
	slices.SortFunc(sorted, netip.AddrPort.Compare)
	return len(slices.Compact(sorted))
}

// maglevSlots returns the table size of a rule that picks by Maglev (a
// jhash), and false for any other rule.
func maglevSlots(r *nftables.Rule) (uint32, bool) {
	for _, e := range r.Exprs {
		if h, ok := e.(*expr.Hash); ok && h.Type == expr.HashTypeJenkins {
			return h.Modulus, true
		}
	}
	return 0, false
}
