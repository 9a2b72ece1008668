package nft

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

// tracePacket is the packet under evaluation: its headers as bytes (the
// payload expressions read them) and the metadata the rules read and write.
type tracePacket struct {
	family   portal.Family
	nh, th   []byte // network and transport headers
	l4proto  byte
	mark     uint32
	ctState  uint32
	ctStatus uint32
}

// Conntrack bits the rules test (include/uapi/linux/netfilter/nf_conntrack_common.h).
const (
	ctStateNew     = 1 << 3 // NF_CT_STATE_BIT(IP_CT_NEW)
	ctStatusSrcNAT = 1 << 4
	ctStatusDstNAT = 1 << 5
)

func newTracePacket(src, dst netip.Addr, sport, dport uint16, proto byte) tracePacket {
	p := tracePacket{l4proto: proto, ctState: ctStateNew}
	if dst.Is4() {
		p.family = portal.IPv4
		p.nh = make([]byte, 20)
		p.nh[0], p.nh[8], p.nh[9] = 0x45, 64, proto
	} else {
		p.family = portal.IPv6
		p.nh = make([]byte, 40)
		p.nh[0], p.nh[6], p.nh[7] = 0x60, proto, 64
	}
	p.th = make([]byte, 20)
	binary.BigEndian.PutUint16(p.th[0:], sport)
	p.setAddr(false, src)
	p.setAddr(true, dst)
	binary.BigEndian.PutUint16(p.th[2:], dport)
	return p
}

func (p *tracePacket) addrOff(dst bool) int {
	off := 12
	if p.family == portal.IPv6 {
		off = 8
	}
	if dst {
		off += addrLen(p.family)
	}
	return off
}

func (p *tracePacket) addr(dst bool) netip.Addr {
	off := p.addrOff(dst)
	a, _ := netip.AddrFromSlice(p.nh[off : off+addrLen(p.family)])
	return a
}

func (p *tracePacket) setAddr(dst bool, a netip.Addr) {
	copy(p.nh[p.addrOff(dst):], addrBytes(a))
}

func (p *tracePacket) dport() uint16 { return binary.BigEndian.Uint16(p.th[2:]) }

func (p *tracePacket) clone() tracePacket {
	c := *p
	c.nh, c.th = slices.Clone(p.nh), slices.Clone(p.th)
	return c
}
