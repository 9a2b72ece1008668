package nft

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/onehop/onehop/portal"
)

// Keys of concatenated set types are laid out in 4-byte registers: each
// field is padded to a multiple of 4 bytes.

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func addrBytes(a netip.Addr) []byte {
	if a.Is4() || a.Is4In6() {
		b := a.Unmap().As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

func portBytes(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

// vipKey encodes ip . l4proto . port.
func vipKey(a netip.Addr, proto portal.Protocol, port uint16) []byte {
	b := append([]byte{}, addrBytes(a)...)
	b = pad4(append(b, byte(proto)))
	return pad4(append(b, portBytes(port)...))
}

// protoPortKey encodes l4proto . port.
func protoPortKey(proto portal.Protocol, port uint16) []byte {
	b := pad4([]byte{byte(proto)})
	return pad4(append(b, portBytes(port)...))
}

// addrPortVal encodes ip . port, the data of an endpoint map.
func addrPortVal(ap netip.AddrPort) []byte {
	b := append([]byte{}, addrBytes(ap.Addr())...)
	return pad4(append(b, portBytes(ap.Port())...))
}

// pairKey encodes ip . ip.
func pairKey(a, b netip.Addr) []byte {
	return append(append([]byte{}, addrBytes(a)...), addrBytes(b)...)
}

// numgenKey encodes a numgen result (host byte order, like the register).
func numgenKey(i uint32) []byte { return binaryutil.NativeEndian.PutUint32(i) }

// decodeVIPKey is the inverse of vipKey.
func decodeVIPKey(f portal.Family, b []byte) (netip.Addr, portal.Protocol, uint16, bool) {
	n := 4
	if f == portal.IPv6 {
		n = 16
	}
	if len(b) < n+8 {
		return netip.Addr{}, 0, 0, false
	}
	a, _ := netip.AddrFromSlice(b[:n])
	return a, portal.Protocol(b[n]), binary.BigEndian.Uint16(b[n+4:]), true
}

func decodeProtoPortKey(b []byte) (portal.Protocol, uint16, bool) {
	if len(b) < 8 {
		return 0, 0, false
	}
	return portal.Protocol(b[0]), binary.BigEndian.Uint16(b[4:]), true
}

func decodeAddrPortVal(f portal.Family, b []byte) (netip.AddrPort, bool) {
	n := 4
	if f == portal.IPv6 {
		n = 16
	}
	if len(b) < n+2 {
		return netip.AddrPort{}, false
	}
	a, _ := netip.AddrFromSlice(b[:n])
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[n:])), true
}

// epKey encodes chain id . index, both as numgen leaves them (host order):
// the rule loads its chain's id with numgen (loadChainID).
func epKey(id uint32, i int) []byte {
	b := binary.NativeEndian.AppendUint32(make([]byte, 0, 8), id)
	return binary.NativeEndian.AppendUint32(b, uint32(i))
}

// rangeElements encodes source ranges as the elements of an interval set:
// the ranges are merged where they overlap or touch (the kernel refuses
// overlapping intervals), and each interval is its first address and, as
// an interval end, the address after its last; an interval that reaches
// the family's last address has no end. The result is sorted by key.
func rangeElements(ranges []netip.Prefix) []nftables.SetElement {
	type span struct{ first, last netip.Addr }
	spans := make([]span, 0, len(ranges))
	for _, p := range ranges {
		p = unmapPrefix(p)
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.Compare(b.first) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 {
			cur := &merged[n-1]
			next := cur.last.Next()
			if !next.IsValid() || s.first.Compare(next) <= 0 {
				cur.last = maxAddr(cur.last, s.last)
				continue
			}
		}
		merged = append(merged, s)
	}
	out := make([]nftables.SetElement, 0, 2*len(merged))
	for _, s := range merged {
		out = append(out, nftables.SetElement{Key: addrBytes(s.first)})
		if end := s.last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: addrBytes(end), IntervalEnd: true})
		}
	}
	return out
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix into its IPv4 prefix, and
// masks it.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() {
		return netip.PrefixFrom(a.Unmap(), max(0, p.Bits()-96)).Masked()
	}
	return p.Masked()
}

// lastAddr is the last address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}
