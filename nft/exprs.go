package nft

import (
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// Small builders for the expressions the ruleset is made of. Register 1 is
// the 16-byte NFT_REG_1; concatenations continue in the 4-byte registers
// after the first field (NFT_REG32_xx), as nft(8) lays them out.

const reg1 = unix.NFT_REG_1

// reg32After returns the 4-byte register that follows n bytes stored from reg 1.
func reg32After(n int) uint32 { return unix.NFT_REG32_00 + uint32((n+3)/4) }

func addrLen(f portal.Family) int {
	if f == portal.IPv6 {
		return 16
	}
	return 4
}

func nfproto(f portal.Family) byte {
	if f == portal.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// matchFamily: meta nfproto ipv4|ipv6.
func matchFamily(f portal.Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{nfproto(f)}},
	}
}

// loadAddr loads ip[6] saddr or daddr into reg.
func loadAddr(f portal.Family, dst bool, reg uint32) expr.Any {
	off := uint32(12) // IPv4 saddr
	if f == portal.IPv6 {
		off = 8
	}
	if dst {
		off += uint32(addrLen(f))
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(addrLen(f))}
}

// loadProtoPort loads meta l4proto . th dport starting at register reg.
func loadProtoPort(reg uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Payload{DestRegister: reg + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// loadVIPKey loads ip daddr . meta l4proto . th dport into reg 1.
func loadVIPKey(f portal.Family) []expr.Any {
	return append([]expr.Any{loadAddr(f, true, reg1)}, loadProtoPort(reg32After(addrLen(f)))...)
}

// loadChainID loads a chain's id into reg 1, the first half of its
// endpoint-map keys: numgen random mod 1 offset <id>, which is always the
// offset. An immediate would hold the same bytes, but nft types the fields
// of a map's key by the expressions that load them, and prints an
// immediate's as `0x2 [invalid type]`.
func loadChainID(id uint32) expr.Any {
	return &expr.Numgen{Register: reg1, Modulus: 1, Offset: id, Type: unix.NFT_NG_RANDOM}
}

func lookup(set string, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert}
}

func vmap(set string) expr.Any {
	return &expr.Lookup{SourceRegister: reg1, SetName: set, DestRegister: 0, IsDestRegSet: true}
}

func verdict(k expr.VerdictKind, chain string) expr.Any { return &expr.Verdict{Kind: k, Chain: chain} }

// setMarkBits: meta mark set meta mark | bits.
func setMarkBits(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bits), Xor: binaryutil.NativeEndian.PutUint32(bits)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// matchMarkBits: meta mark & bits == bits.
func matchMarkBits(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// clearMarkBits: meta mark set meta mark & ^bits.
func clearMarkBits(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// matchCtState: ct state & bits != 0.
func matchCtState(bits uint32) []expr.Any { return matchCtBits(expr.CtKeySTATE, bits) }

// matchCtStatus: ct status & bits != 0.
func matchCtStatus(bits uint32) []expr.Any { return matchCtBits(expr.CtKeySTATUS, bits) }

// matchCtBits: ct <key> & bits != 0, for a 32-bit key (state, status).
func matchCtBits(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: key},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// matchL4Proto: meta l4proto p.
func matchL4Proto(p portal.Protocol) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{byte(p)}},
	}
}

func masquerade() expr.Any { return &expr.Masq{FullyRandom: true} }

func counter() expr.Any { return &expr.Counter{} }

// matchLocalSource: fib saddr type local (traffic from this node).
func matchLocalSource() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}
