package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file prints the table as read back from the kernel in nft syntax,
// as `nft list table inet onehop` does (nftables 1.0.6): sets and maps with
// their types, flags and elements, then chains with their rules
// (nftsyntax.go). It needs no nft binary. Elements are sorted by key; the
// kernel's order of sets and chains is kept.

// textOptions select what the rendering leaves out.
type textOptions struct {
	// skipEmptyShards leaves out the endpoint maps that hold no element
	// (most of them in a small cluster), with one comment saying so.
	skipEmptyShards bool
}

// render prints the table for people: what the golden files hold and what
// `agent dump-rules -o nft` shows.
func (k *kernelTable) render() string { return k.text(textOptions{skipEmptyShards: true}) }

// text prints the table in nft syntax.
func (k *kernelTable) text(o textOptions) string {
	var blocks []string
	skipped, skippedFlat := 0, 0
	for _, s := range k.sets {
		if s.anonymous() {
			continue // printed inline by the rules that use them
		}
		if o.skipEmptyShards && strings.HasPrefix(s.name, "endpoints") && len(k.elems[s.name]) == 0 {
			skipped++
			continue
		}
		if o.skipEmptyShards && isFlatMap(s.name) && len(k.elems[s.name]) == 0 {
			skippedFlat++
			continue
		}
		blocks = append(blocks, k.setText(s))
	}
	for _, c := range k.chainList {
		blocks = append(blocks, k.chainText(c))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", TableName)
	if skipped > 0 {
		fmt.Fprintf(&b, "\t# %d empty endpoint maps (endpoints<family>-<shard>) are not shown\n", skipped)
	}
	if skippedFlat > 0 {
		fmt.Fprintf(&b, "\t# %d empty flat maps (flat<family>-<count>, flat-nodeports<family>-<count>) are not shown\n", skippedFlat)
	}
	b.WriteString(strings.Join(blocks, "\n"))
	b.WriteString("}\n")
	return b.String()
}

func (k *kernelTable) setText(s *setDecl) string {
	var b strings.Builder
	kind := "set"
	if s.isMap() {
		kind = "map"
	}
	fmt.Fprintf(&b, "\t%s %s {\n", kind, s.name)
	fmt.Fprintf(&b, "\t\t%s\n", s.declText())
	if s.size != 0 {
		fmt.Fprintf(&b, "\t\tsize %d\n", s.size)
	}
	var flags []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{unix.NFT_SET_CONSTANT, "constant"}, {unix.NFT_SET_EVAL, "dynamic"}, {unix.NFT_SET_INTERVAL, "interval"}, {unix.NFT_SET_TIMEOUT, "timeout"}} {
		if s.flags&f.bit != 0 {
			flags = append(flags, f.name)
		}
	}
	if len(flags) > 0 {
		fmt.Fprintf(&b, "\t\tflags %s\n", strings.Join(flags, ","))
	}
	if s.timeout != 0 {
		fmt.Fprintf(&b, "\t\ttimeout %s\n", nftDuration(s.timeout))
	}
	var texts []string
	if s.flags&unix.NFT_SET_INTERVAL != 0 && !s.isMap() {
		texts = intervalTexts(s, k.elems[s.name])
	} else {
		for _, el := range k.elems[s.name] {
			texts = append(texts, elemText(s, el))
		}
	}
	if len(texts) > 0 {
		b.WriteString("\t\telements = { ")
		b.WriteString(strings.Join(texts, ",\n\t\t\t     "))
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
	return b.String()
}

// intervalTexts prints the elements of an interval set of addresses as nft
// does: each interval from its first element to the interval end that
// follows it, as a prefix when it is one (an address alone when it holds
// one), else as first-last; an interval without an end reaches the last
// address. Ends with no interval before them are not printed.
func intervalTexts(s *setDecl, els []nftables.SetElement) []string {
	els = slices.Clone(els)
	slices.SortStableFunc(els, func(a, b nftables.SetElement) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		switch {
		case a.IntervalEnd == b.IntervalEnd:
			return 0
		case a.IntervalEnd:
			return -1 // the end of one interval before the start of the next
		}
		return 1
	})
	var out []string
	for i := 0; i < len(els); i++ {
		if els[i].IntervalEnd {
			continue
		}
		first, ok := netip.AddrFromSlice(els[i].Key)
		if !ok {
			out = append(out, s.keyText(els[i].Key))
			continue
		}
		var last netip.Addr
		if i+1 < len(els) && els[i+1].IntervalEnd {
			end, _ := netip.AddrFromSlice(els[i+1].Key)
			last = end.Prev()
			i++
		} else {
			last = lastAddr(netip.PrefixFrom(first, 0))
		}
		out = append(out, rangeText(first, last))
	}
	return out
}

// rangeText prints the addresses first to last.
func rangeText(first, last netip.Addr) string {
	if first == last {
		return first.String()
	}
	for bits := 0; bits <= first.BitLen(); bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() == first && lastAddr(p) == last {
			return p.String()
		}
	}
	return first.String() + "-" + last.String()
}

// elemText prints one element: key, timeouts, comment, and for maps the data.
func elemText(s *setDecl, el nftables.SetElement) string {
	var b strings.Builder
	b.WriteString(s.keyText(el.Key))
	if el.Timeout != 0 && el.Timeout != s.timeout {
		fmt.Fprintf(&b, " timeout %s", nftDuration(el.Timeout))
	}
	if el.Expires != 0 {
		fmt.Fprintf(&b, " expires %s", nftDuration(el.Expires))
	}
	if el.Comment != "" {
		fmt.Fprintf(&b, " comment %q", el.Comment)
	}
	if s.isMap() {
		b.WriteString(" : ")
		switch {
		case el.VerdictData != nil:
			b.WriteString(verdictText(el.VerdictData))
		case s.dataType == nftVerdictType:
			b.WriteString(verdictAttrText(el.Val))
		default:
			b.WriteString(valueText(s.dataFields(), el.Val))
		}
	}
	return b.String()
}

// verdictAttrText decodes the verdict of a map element, which
// github.com/google/nftables hands over as the undecoded nested attributes
// NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN.
func verdictAttrText(b []byte) string {
	v := decodeVerdict(b)
	if v == nil {
		return fmt.Sprintf("[undecodable verdict 0x%x]", b)
	}
	return verdictText(v)
}

func verdictText(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictBreak:
		return "break"
	case expr.VerdictQueue:
		return "queue"
	case expr.VerdictStolen:
		return "stolen"
	}
	return fmt.Sprintf("[verdict %d]", v.Kind)
}

// chainText prints a chain: for a base chain its type, hook, priority and
// policy, then its rules.
func (k *kernelTable) chainText(c *nftables.Chain) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
	if c.Hooknum != nil {
		policy := "accept"
		if c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop {
			policy = "drop"
		}
		prio := 0
		if c.Priority != nil {
			prio = int(*c.Priority)
		}
		fmt.Fprintf(&b, "\t\ttype %s hook %s priority %s; policy %s;\n", c.Type, hookName(*c.Hooknum), priorityText(prio, *c.Hooknum), policy)
	}
	for _, r := range k.rules[c.Name] {
		fmt.Fprintf(&b, "\t\t%s\n", k.ruleText(r))
	}
	b.WriteString("\t}\n")
	return b.String()
}

func hookName(h nftables.ChainHook) string {
	switch h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("[hook %d]", h)
}

// priorityText names a priority as nft does: the standard name when it is
// within 10 of one that the hook allows, else the number.
func priorityText(prio int, hook nftables.ChainHook) string {
	for _, p := range []struct {
		name string
		val  int
		hook *nftables.ChainHook // nil: any hook
	}{
		{"raw", -300, nil}, {"mangle", -150, nil}, {"dstnat", -100, nftables.ChainHookPrerouting},
		{"filter", 0, nil}, {"security", 50, nil}, {"srcnat", 100, nftables.ChainHookPostrouting},
	} {
		if p.hook != nil && *p.hook != hook {
			continue
		}
		switch off := prio - p.val; {
		case off == 0:
			return p.name
		case off > 0 && off <= 10:
			return fmt.Sprintf("%s + %d", p.name, off)
		case off < 0 && off >= -10:
			return fmt.Sprintf("%s - %d", p.name, -off)
		}
	}
	return strconv.Itoa(prio)
}

// nftDuration prints a duration as nft does: 1d2h3m4s5ms.
func nftDuration(d time.Duration) string {
	ms := d.Milliseconds()
	if ms == 0 {
		return "0s"
	}
	var b strings.Builder
	for _, u := range []struct {
		ms   int64
		name string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if n := ms / u.ms; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			ms -= n * u.ms
		}
	}
	return b.String()
}

// Datatypes, numbered as nft numbers them on the wire (and in set key
// types, where a concatenation packs one per 6 bits).
const (
	dtInvalid     = 0
	dtVerdict     = 1
	dtNfProto     = 2
	dtInteger     = 4
	dtIPv4        = 7
	dtIPv6        = 8
	dtInetProto   = 12
	dtInetService = 13
	dtMark        = 19
	dtCtState     = 26
	dtCtStatus    = 28
	// Types with no wire number of their own here.
	dtHex         = 1000 // raw payload: an integer printed in hex
	dtFibAddr     = 1001 // fib ... type
	dtRejectIx    = 1002
	dtHostInteger = 1003 // an integer in host byte order (numgen's, jhash's)
)

var typeNames = map[uint32]string{
	dtVerdict: "verdict", dtNfProto: "nf_proto", dtInteger: "integer", 5: "string", 6: "ll_addr",
	dtIPv4: "ipv4_addr", dtIPv6: "ipv6_addr", 9: "ether_addr", 10: "ether_type", dtInetProto: "inet_proto",
	dtInetService: "inet_service", dtMark: "mark", 20: "iface_index", dtCtState: "ct_state", dtCtStatus: "ct_status",
}

// typeFields splits a set's key or data type into its fields, first field
// first.
func typeFields(t uint32) []uint32 {
	if t == nftVerdictType {
		return []uint32{dtVerdict}
	}
	var f []uint32
	for ; t != 0; t >>= nftables.SetConcatTypeBits {
		f = append([]uint32{t & nftables.SetConcatTypeMask}, f...)
	}
	return f
}

func typeName(fields []uint32, size uint32) string {
	var names []string
	for _, f := range fields {
		if f == dtHostInteger {
			f = dtInteger
		}
		n, ok := typeNames[f]
		if !ok {
			n = fmt.Sprintf("[type %d]", f)
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return fmt.Sprintf("[type 0, %d bytes]", size)
	}
	return strings.Join(names, " . ")
}

// fieldLen is the size in bytes of a value of type t; 0 when it varies.
func fieldLen(t uint32) int {
	switch t {
	case dtIPv4, dtInteger, dtHostInteger, dtMark, dtCtState, dtCtStatus:
		return 4
	case dtIPv6:
		return 16
	case dtInetProto, dtNfProto:
		return 1
	case dtInetService:
		return 2
	}
	return 0
}

// valueText prints a set key or map value whose fields have the datatypes
// fields.
func valueText(fields []uint32, b []byte) string {
	if len(fields) <= 1 {
		ft := uint32(dtInvalid)
		if len(fields) == 1 {
			ft = fields[0]
		}
		return constText(ft, b)
	}
	var parts []string
	for i, f := range fields {
		n := fieldLen(f)
		if n == 0 || len(b) < n {
			return fmt.Sprintf("[undecodable %s 0x%x]", typeName(fields, 0), b)
		}
		parts = append(parts, constText(f, b[:n]))
		if i < len(fields)-1 {
			b = b[min(len(b), (n+3)/4*4):]
		}
	}
	return strings.Join(parts, " . ")
}

// constText prints a constant of type t.
func constText(t uint32, b []byte) string {
	switch t {
	case dtIPv4, dtIPv6:
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case dtInetProto:
		if len(b) >= 1 {
			return protoName(b[0])
		}
	case dtInetService:
		if len(b) >= 2 {
			return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
		}
	case dtNfProto:
		if len(b) >= 1 {
			switch b[0] {
			case unix.NFPROTO_IPV4:
				return "ipv4"
			case unix.NFPROTO_IPV6:
				return "ipv6"
			}
			return strconv.Itoa(int(b[0]))
		}
	case dtMark:
		if len(b) == 4 {
			return fmt.Sprintf("0x%08x", binaryutil.NativeEndian.Uint32(b))
		}
	case dtInteger:
		if len(b) <= 8 {
			return strconv.FormatUint(beUint(b), 10)
		}
	case dtHostInteger:
		if len(b) == 4 {
			return strconv.FormatUint(uint64(binaryutil.NativeEndian.Uint32(b)), 10)
		}
	case dtHex:
		if len(b) <= 8 {
			return fmt.Sprintf("%#x", beUint(b))
		}
	case dtCtState:
		if len(b) == 4 {
			return bitNames(binaryutil.NativeEndian.Uint32(b), ctStateBits)
		}
	case dtCtStatus:
		if len(b) == 4 {
			return bitNames(binaryutil.NativeEndian.Uint32(b), ctStatusBits)
		}
	case dtFibAddr:
		if len(b) == 4 {
			v := binaryutil.NativeEndian.Uint32(b)
			if int(v) < len(fibAddrTypes) {
				return fibAddrTypes[v]
			}
			return strconv.Itoa(int(v))
		}
	case dtVerdict:
		return verdictAttrText(b)
	}
	if len(b) <= 8 {
		return fmt.Sprintf("%#x [invalid type]", beUint(b))
	}
	return fmt.Sprintf("0x%x [invalid type]", b)
}

func beUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

func protoName(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(p))
}

type bitName struct {
	bit  uint32
	name string
}

var ctStateBits = []bitName{{1, "invalid"}, {2, "established"}, {4, "related"}, {8, "new"}, {64, "untracked"}}

var ctStatusBits = []bitName{{1, "expected"}, {2, "seen-reply"}, {4, "assured"}, {8, "confirmed"},
	{16, "snat"}, {32, "dnat"}, {512, "dying"}}

func bitNames(v uint32, names []bitName) string {
	var out []string
	for _, n := range names {
		if v&n.bit != 0 {
			out = append(out, n.name)
			v &^= n.bit
		}
	}
	if v != 0 || len(out) == 0 {
		out = append(out, fmt.Sprintf("0x%x", v))
	}
	return strings.Join(out, ",")
}

var fibAddrTypes = []string{"unspec", "unicast", "local", "broadcast", "anycast", "multicast", "blackhole", "unreachable", "prohibit"}
