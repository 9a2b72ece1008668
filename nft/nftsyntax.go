package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file turns a rule's expressions, as the kernel returns them, back
// into the statement nft prints for it: loads into registers become the
// operands of the compare, lookup, map or NAT that reads those registers,
// and `meta nfproto ipv4` disappears into the `ip daddr` that needs it, as
// in `nft list`. An expression it cannot decode prints as
// `[not decoded: ...]`, never nothing.

// regValue is what a register holds while a rule is decoded.
type regValue struct {
	text string // the expression that produced it, in nft syntax
	dt   uint32 // its datatype, for printing the constants it meets
	size int    // bytes
	imm  []byte // an immediate's data: printed by whoever reads it

	// bitwise: (base & mask) ^ xor
	base      *regValue
	mask, xor []byte

	mapResult bool // the data of a map lookup
}

type ruleStmt struct {
	text string
	// implied statements (meta nfproto ipv4 before ip daddr) are left
	// out, as nft leaves them out.
	implied bool
}

type ruleDecoder struct {
	k     *kernelTable
	slots map[int]*regValue // by the first 4-byte slot they fill
	stmts []ruleStmt
	// netCtx is the network protocol (dtIPv4, dtIPv6) a `meta nfproto`
	// match established, 0 when none; ctxStmt is that match's statement.
	netCtx  uint32
	ctxStmt int
}

// ruleText prints one rule in nft syntax.
func (k *kernelTable) ruleText(r *nftables.Rule) string {
	d := &ruleDecoder{k: k, slots: map[int]*regValue{}, ctxStmt: -1}
	for _, e := range r.Exprs {
		d.expr(e)
	}
	return d.String()
}

func (d *ruleDecoder) String() string {
	var parts []string
	for _, s := range d.stmts {
		if !s.implied {
			parts = append(parts, s.text)
		}
	}
	return strings.Join(parts, " ")
}

func (d *ruleDecoder) stmt(format string, args ...any) {
	d.stmts = append(d.stmts, ruleStmt{text: fmt.Sprintf(format, args...)})
}

// slot returns the first 4-byte register slot of a register: the 16-byte
// NFT_REG_1..4 hold four slots each, NFT_REG32_00..15 one.
func slot(reg uint32) int {
	switch {
	case reg >= unix.NFT_REG_1 && reg <= unix.NFT_REG_4:
		return int(reg-unix.NFT_REG_1) * 4
	case reg >= unix.NFT_REG32_00 && reg <= unix.NFT_REG32_15:
		return int(reg - unix.NFT_REG32_00)
	}
	return -1
}

func slotsOf(size int) int { return max(1, (size+3)/4) }

func (d *ruleDecoder) set(reg uint32, v *regValue) {
	s := slot(reg)
	n := slotsOf(v.size)
	for start, old := range d.slots {
		if start < s+n && s < start+slotsOf(old.size) {
			delete(d.slots, start)
		}
	}
	d.slots[s] = v
}

// take returns and forgets what reg holds.
func (d *ruleDecoder) take(reg uint32) *regValue {
	s := slot(reg)
	v, ok := d.slots[s]
	if !ok {
		return &regValue{text: fmt.Sprintf("[reg %d: empty]", reg), dt: dtHex}
	}
	delete(d.slots, s)
	return v
}

// key takes the lookup key starting at reg: one value, or the
// concatenation of the values in the registers that follow, up to keyLen
// bytes (each field padded to 4); keyLen 0: as long as registers are filled.
func (d *ruleDecoder) key(reg uint32, keyLen int) string {
	s := slot(reg)
	var parts []string
	for covered := 0; keyLen == 0 || covered < keyLen; {
		v, ok := d.slots[s]
		if !ok {
			break
		}
		delete(d.slots, s)
		parts = append(parts, operand(v))
		covered += slotsOf(v.size) * 4
		s += slotsOf(v.size)
	}
	if len(parts) == 0 {
		return fmt.Sprintf("[reg %d: empty]", reg)
	}
	return strings.Join(parts, " . ")
}

// operand prints a register's value where an expression is expected.
func operand(v *regValue) string {
	switch {
	case v.imm != nil:
		return constText(v.dt, v.imm)
	case v.base != nil:
		return binopText(v)
	}
	return v.text
}

func binopText(v *regValue) string {
	base, dt := operand(v.base), v.base.dt
	switch {
	case allZero(v.xor):
		return fmt.Sprintf("%s & %s", base, constText(dt, v.mask))
	case isComplement(v.mask, v.xor):
		return fmt.Sprintf("%s | %s", base, constText(dt, v.xor))
	case allOnes(v.mask):
		return fmt.Sprintf("%s ^ %s", base, constText(dt, v.xor))
	}
	return fmt.Sprintf("(%s & %s) ^ %s", base, constText(dt, v.mask), constText(dt, v.xor))
}

func (d *ruleDecoder) expr(e expr.Any) {
	switch e := e.(type) {
	case *expr.Meta:
		d.meta(e)
	case *expr.Payload:
		d.payload(e)
	case *expr.Ct:
		d.ct(e)
	case *expr.Fib:
		d.fib(e)
	case *expr.Numgen:
		kind := "random"
		if e.Type == unix.NFT_NG_INCREMENTAL {
			kind = "inc"
		}
		text := fmt.Sprintf("numgen %s mod %d", kind, e.Modulus)
		if e.Offset != 0 {
			text += fmt.Sprintf(" offset %d", e.Offset)
		}
		d.set(e.Register, &regValue{text: text, dt: dtInteger, size: 4})
	case *expr.Hash:
		d.hash(e)
	case *expr.Immediate:
		d.set(e.Register, &regValue{imm: e.Data, dt: dtInvalid, size: len(e.Data)})
	case *expr.Bitwise:
		src := d.take(e.SourceRegister)
		d.set(e.DestRegister, &regValue{text: src.text, dt: src.dt, size: src.size, base: src, mask: e.Mask, xor: e.Xor})
	case *expr.Cmp:
		d.cmp(e)
	case *expr.Lookup:
		d.lookup(e)
	case *expr.Verdict:
		d.stmt("%s", verdictText(e))
	case *expr.Counter:
		d.stmt("counter packets %d bytes %d", e.Packets, e.Bytes)
	case *expr.NAT:
		d.nat(e)
	case *expr.Masq:
		text := "masquerade"
		if e.ToPorts {
			text += " to :" + operand(d.take(e.RegProtoMin))
		}
		if f := natFlags(e.Random, e.FullyRandom, e.Persistent); f != "" {
			text += " " + f
		}
		d.stmt("%s", text)
	case *expr.Reject:
		d.stmt("%s", rejectText(e))
	case *expr.Dynset:
		d.dynset(e)
	default:
		d.stmt("[not decoded: %T %+v]", e, e)
	}
}

// hash: jhash <the registers it reads> mod N seed 0x..., or symhash mod N
// (a hash of the packet's addresses and ports, in either direction).
func (d *ruleDecoder) hash(e *expr.Hash) {
	text := fmt.Sprintf("symhash mod %d", e.Modulus)
	if e.Type == expr.HashTypeJenkins {
		text = fmt.Sprintf("jhash %s mod %d seed 0x%x", d.key(e.SourceRegister, int(e.Length)), e.Modulus, e.Seed)
		// nft leaves out a `meta nfproto` that a match or lookup on an
		// address implies, not one a hash of it does.
		if d.ctxStmt >= 0 {
			d.stmts[d.ctxStmt].implied = false
		}
	}
	if e.Offset != 0 {
		text += fmt.Sprintf(" offset %d", e.Offset)
	}
	d.set(e.DestRegister, &regValue{text: text, dt: dtInteger, size: 4})
}

var metaKeys = map[expr.MetaKey]struct {
	name string
	dt   uint32
	size int
}{
	expr.MetaKeyNFPROTO: {"nfproto", dtNfProto, 1},
	expr.MetaKeyL4PROTO: {"l4proto", dtInetProto, 1},
	expr.MetaKeyMARK:    {"mark", dtMark, 4},
	expr.MetaKeyIIF:     {"iif", dtHex, 4},
	expr.MetaKeyOIF:     {"oif", dtHex, 4},
	expr.MetaKeyLEN:     {"length", dtInteger, 4},
}

func (d *ruleDecoder) meta(e *expr.Meta) {
	m, ok := metaKeys[e.Key]
	if !ok {
		m.name, m.dt, m.size = fmt.Sprintf("[meta key %d]", e.Key), dtHex, 4
	}
	if e.SourceRegister {
		d.stmt("meta %s set %s", m.name, operand(d.take(e.Register)))
		return
	}
	d.set(e.Register, &regValue{text: "meta " + m.name, dt: m.dt, size: m.size})
}

func (d *ruleDecoder) payload(e *expr.Payload) {
	if e.OperationType == expr.PayloadWrite {
		d.stmt("[not decoded: payload write %+v]", *e)
		return
	}
	v := &regValue{dt: dtHex, size: int(e.Len)}
	switch e.Base {
	case expr.PayloadBaseNetworkHeader:
		v.text = fmt.Sprintf("@nh,%d,%d", e.Offset*8, e.Len*8)
		if name, dt, ok := d.netField(e.Offset, e.Len); ok {
			v.text, v.dt = name, dt
			d.stmts[d.ctxStmt].implied = true
		}
	case expr.PayloadBaseTransportHeader:
		v.text = fmt.Sprintf("@th,%d,%d", e.Offset*8, e.Len*8)
		switch {
		case e.Offset == 0 && e.Len == 2:
			v.text, v.dt = "th sport", dtInetService
		case e.Offset == 2 && e.Len == 2:
			v.text, v.dt = "th dport", dtInetService
		}
	default:
		v.text = fmt.Sprintf("@ll,%d,%d", e.Offset*8, e.Len*8)
	}
	d.set(e.DestRegister, v)
}

// netField names a network header field when the rule matched the
// protocol before.
func (d *ruleDecoder) netField(off, n uint32) (string, uint32, bool) {
	switch {
	case d.netCtx == dtIPv4 && off == 12 && n == 4:
		return "ip saddr", dtIPv4, true
	case d.netCtx == dtIPv4 && off == 16 && n == 4:
		return "ip daddr", dtIPv4, true
	case d.netCtx == dtIPv6 && off == 8 && n == 16:
		return "ip6 saddr", dtIPv6, true
	case d.netCtx == dtIPv6 && off == 24 && n == 16:
		return "ip6 daddr", dtIPv6, true
	}
	return "", 0, false
}

var ctKeys = map[expr.CtKey]struct {
	name string
	dt   uint32
}{
	expr.CtKeySTATE:  {"state", dtCtState},
	expr.CtKeySTATUS: {"status", dtCtStatus},
	expr.CtKeyMARK:   {"mark", dtMark},
}

func (d *ruleDecoder) ct(e *expr.Ct) {
	k, ok := ctKeys[e.Key]
	if !ok {
		k.name, k.dt = fmt.Sprintf("[ct key %d]", e.Key), dtHex
	}
	if e.SourceRegister {
		d.stmt("ct %s set %s", k.name, operand(d.take(e.Register)))
		return
	}
	d.set(e.Register, &regValue{text: "ct " + k.name, dt: k.dt, size: 4})
}

func (d *ruleDecoder) fib(e *expr.Fib) {
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{e.FlagSADDR, "saddr"}, {e.FlagDADDR, "daddr"}, {e.FlagMARK, "mark"}, {e.FlagIIF, "iif"}, {e.FlagOIF, "oif"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	result, dt := "[fib result]", uint32(dtHex)
	switch {
	case e.ResultADDRTYPE:
		result, dt = "type", dtFibAddr
	case e.ResultOIF:
		result = "oif"
	case e.ResultOIFNAME:
		result = "oifname"
	}
	d.set(e.Register, &regValue{text: "fib " + strings.Join(flags, " . ") + " " + result, dt: dt, size: 4})
}

var cmpOps = map[expr.CmpOp]string{expr.CmpOpEq: "==", expr.CmpOpNeq: "!=", expr.CmpOpLt: "<", expr.CmpOpLte: "<=", expr.CmpOpGt: ">", expr.CmpOpGte: ">="}

func (d *ruleDecoder) cmp(e *expr.Cmp) {
	left := d.take(e.Register)
	op := cmpOps[e.Op]
	if left.base != nil {
		d.maskedCmp(left, op, e.Data)
		return
	}
	right := constText(left.dt, e.Data)
	if left.text == "meta nfproto" && e.Op == expr.CmpOpEq && len(e.Data) == 1 {
		switch e.Data[0] {
		case unix.NFPROTO_IPV4:
			d.netCtx = dtIPv4
		case unix.NFPROTO_IPV6:
			d.netCtx = dtIPv6
		}
		d.ctxStmt = len(d.stmts)
	}
	if e.Op == expr.CmpOpEq {
		d.stmt("%s %s", operand(left), right)
		return
	}
	d.stmt("%s %s %s", operand(left), op, right)
}

// maskedCmp prints (x & mask) op data: a flag test (`ct state new`), an
// address prefix (`ip saddr != 10.244.0.0/16`) or the bitwise itself.
func (d *ruleDecoder) maskedCmp(left *regValue, op string, data []byte) {
	base := operand(left.base)
	if allZero(left.xor) {
		switch dt := left.base.dt; {
		case (dt == dtCtState || dt == dtCtStatus) && allZero(data) && op == "!=" && len(left.mask) == 4:
			d.stmt("%s %s", base, constText(dt, left.mask))
			return
		case dt == dtIPv4 || dt == dtIPv6:
			if bits, ok := prefixLen(left.mask); ok {
				if a, ok := netip.AddrFromSlice(data); ok && netip.PrefixFrom(a, bits).Masked().Addr() == a {
					neg := ""
					if op == "!=" {
						neg = "!= "
					}
					d.stmt("%s %s%s", base, neg, netip.PrefixFrom(a, bits))
					return
				}
			}
		}
	}
	d.stmt("%s %s %s", binopText(left), op, constText(left.base.dt, data))
}

func (d *ruleDecoder) lookup(e *expr.Lookup) {
	s := d.k.set(e.SetName)
	keyLen := 0
	if s != nil {
		keyLen = int(s.keyLen)
	}
	key := d.key(e.SourceRegister, keyLen)
	ref := d.setRef(e.SetName, s)
	switch {
	case !e.IsDestRegSet && e.Invert:
		d.stmt("%s != %s", key, ref)
	case !e.IsDestRegSet:
		d.stmt("%s %s", key, ref)
	case e.DestRegister == 0:
		d.stmt("%s vmap %s", key, ref)
	default:
		v := &regValue{text: key + " map " + ref, dt: dtHex, size: 4, mapResult: true}
		if s != nil {
			v.size = int(s.dataLen)
			if f := s.dataFields(); len(f) == 1 {
				v.dt = f[0]
			}
		}
		d.set(e.DestRegister, v)
	}
}

// setRef is @name, or the elements of an anonymous set.
func (d *ruleDecoder) setRef(name string, s *setDecl) string {
	if s == nil {
		return "@" + name + " [not in the table]"
	}
	if s.flags&unix.NFT_SET_ANONYMOUS == 0 {
		return "@" + name
	}
	var els []string
	for _, el := range d.k.elems[name] {
		els = append(els, elemText(s, el))
	}
	return "{ " + strings.Join(els, ", ") + " }"
}

func (d *ruleDecoder) nat(e *expr.NAT) {
	kind := map[expr.NATType]string{expr.NATTypeDestNAT: "dnat", expr.NATTypeSourceNAT: "snat"}[e.Type]
	if kind == "" {
		kind = fmt.Sprintf("[nat type %d]", e.Type)
	}
	fam := "ip"
	if e.Family == unix.NFPROTO_IPV6 {
		fam = "ip6"
	}
	to := ""
	if e.RegAddrMin != 0 {
		addr := d.take(e.RegAddrMin)
		switch {
		case addr.mapResult:
			to = addr.text // the map's data holds address and port
		case addr.imm != nil:
			a, ok := netip.AddrFromSlice(addr.imm)
			if !ok {
				to = constText(dtInvalid, addr.imm)
				break
			}
			to = a.String()
			if e.RegProtoMin != 0 {
				if p := d.take(e.RegProtoMin); len(p.imm) == 2 {
					to = netip.AddrPortFrom(a, uint16(beUint(p.imm))).String()
				} else {
					to += ":" + operand(p)
				}
			}
		default:
			to = operand(addr)
			if e.RegProtoMin != 0 {
				to += ":" + operand(d.take(e.RegProtoMin))
			}
		}
	} else if e.RegProtoMin != 0 {
		to = ":" + operand(d.take(e.RegProtoMin))
	}
	text := kind + " " + fam + " to " + to
	if f := natFlags(e.Random, e.FullyRandom, e.Persistent); f != "" {
		text += " " + f
	}
	d.stmt("%s", text)
}

func natFlags(random, fullyRandom, persistent bool) string {
	var f []string
	if random {
		f = append(f, "random")
	}
	if fullyRandom {
		f = append(f, "fully-random")
	}
	if persistent {
		f = append(f, "persistent")
	}
	return strings.Join(f, ",")
}

var icmpxCodes = []string{"no-route", "port-unreachable", "host-unreachable", "admin-prohibited"}

func rejectText(e *expr.Reject) string {
	switch e.Type {
	case unix.NFT_REJECT_TCP_RST:
		return "reject with tcp reset"
	case unix.NFT_REJECT_ICMPX_UNREACH:
		if e.Code == unix.NFT_REJECT_ICMPX_PORT_UNREACH {
			return "reject"
		}
		if int(e.Code) < len(icmpxCodes) {
			return "reject with icmpx " + icmpxCodes[e.Code]
		}
		return fmt.Sprintf("reject with icmpx %d", e.Code)
	case unix.NFT_REJECT_ICMP_UNREACH:
		return fmt.Sprintf("reject with icmp %d", e.Code)
	}
	return fmt.Sprintf("[not decoded: reject type %d code %d]", e.Type, e.Code)
}

func (d *ruleDecoder) dynset(e *expr.Dynset) {
	op := map[uint32]string{unix.NFT_DYNSET_OP_ADD: "add", unix.NFT_DYNSET_OP_UPDATE: "update", 2: "delete"}[e.Operation]
	if op == "" {
		op = "[dynset op " + strconv.Itoa(int(e.Operation)) + "]"
	}
	s := d.k.set(e.SetName)
	keyLen := 0
	if s != nil {
		keyLen = int(s.keyLen)
	}
	inner := d.key(e.SrcRegKey, keyLen)
	if e.Timeout != 0 {
		inner += " timeout " + nftDuration(e.Timeout)
	}
	if len(e.Exprs) > 0 {
		sub := &ruleDecoder{k: d.k, slots: map[int]*regValue{}, ctxStmt: -1}
		for _, x := range e.Exprs {
			sub.expr(x)
		}
		inner += " " + sub.String()
	}
	if e.SrcRegData != 0 {
		inner += " : " + operand(d.take(e.SrcRegData))
	}
	d.stmt("%s @%s { %s }", op, e.SetName, inner)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func allOnes(b []byte) bool {
	for _, c := range b {
		if c != 0xff {
			return false
		}
	}
	return len(b) > 0
}

func isComplement(a, b []byte) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for i := range a {
		if a[i] != ^b[i] {
			return false
		}
	}
	return true
}

// prefixLen returns n when mask is n one bits followed by zero bits.
func prefixLen(mask []byte) (int, bool) {
	n, done := 0, false
	for _, c := range mask {
		for bit := 7; bit >= 0; bit-- {
			one := c&(1<<bit) != 0
			switch {
			case one && done:
				return 0, false
			case one:
				n++
			default:
				done = true
			}
		}
	}
	return n, true
}
