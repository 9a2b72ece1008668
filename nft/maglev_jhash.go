package nft

import (
	"encoding/binary"
	"math/bits"
)

// kernelJhash computes what the kernel's hash expression (type jenkins)
// stores for the bytes it reads from the registers: Bob Jenkins' lookup3
// hash as Linux's jhash() computes it (whole 4-byte words read in the
// CPU's byte order, the last 1 to 12 bytes added byte by byte), scaled
// into [0, mod) by multiplying and shifting, as reciprocal_scale() does
// (not by a remainder), plus offset. The trace evaluator uses it to follow
// a Maglev chain's pick exactly.
func kernelJhash(data []byte, seed, mod, offset uint32) uint32 {
	h := jhash(data, seed)
	return uint32(uint64(h)*uint64(mod)>>32) + offset
}

func jhash(k []byte, seed uint32) uint32 {
	a := 0xdeadbeef + uint32(len(k)) + seed
	b, c := a, a
	word := func(i int) uint32 { return binary.NativeEndian.Uint32(k[i:]) }
	for len(k) > 12 {
		a += word(0)
		b += word(4)
		c += word(8)
		a, b, c = jhashMix(a, b, c)
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	// The tail, in little-endian order whatever the CPU's, into a, b, c.
	var tail [12]byte
	copy(tail[:], k)
	a += binary.LittleEndian.Uint32(tail[0:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	return jhashFinal(a, b, c)
}

func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func jhashFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}
