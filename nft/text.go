package nft

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/portal"
)

// render prints the table as read from the kernel: every chain with its
// rules at the netlink expression level (what `nft --debug=netlink` shows)
// and every named set with decoded elements. It needs no nft binary, is
// deterministic and is what the golden files hold.
func (k *kernelTable) render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\n", TableName)
	for _, name := range k.chains {
		fmt.Fprintf(&b, "\nchain %s\n", name)
		for _, r := range k.rules[name] {
			parts := make([]string, 0, len(r.Exprs))
			for _, e := range r.Exprs {
				parts = append(parts, k.exprString(e))
			}
			fmt.Fprintf(&b, "  %s\n", strings.Join(parts, " "))
		}
	}
	for _, s := range fixedSets(&nftables.Table{Name: TableName}) {
		els := k.elems[s.Name]
		if len(els) == 0 && strings.HasPrefix(s.Name, "endpoints") {
			continue // empty shards
		}
		fmt.Fprintf(&b, "\nset %s (%d)\n", s.Name, len(els))
		for _, el := range els {
			fmt.Fprintf(&b, "  %s", decodeElemKey(s.Name, el.Key))
			if el.VerdictData != nil {
				fmt.Fprintf(&b, " : %s", verdictString(el.VerdictData))
			} else if len(el.Val) > 0 {
				fmt.Fprintf(&b, " : %s", decodeElemVal(setFamily(s.Name), el.Val))
			}
			if el.Comment != "" {
				fmt.Fprintf(&b, "  # %s", el.Comment)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func setFamily(set string) portal.Family {
	if strings.HasSuffix(set, "6") {
		return portal.IPv6
	}
	return portal.IPv4
}

func decodeElemVal(fm portal.Family, v []byte) string {
	if ap, ok := decodeAddrPortVal(fm, v); ok {
		return ap.String()
	}
	return "0x" + hex.EncodeToString(v)
}

func decodeElemKey(set string, key []byte) string {
	f := portal.IPv4
	if strings.HasSuffix(set, "6") {
		f = portal.IPv6
	}
	switch {
	case strings.HasPrefix(set, "vips"), strings.HasPrefix(set, "noep") && !strings.HasPrefix(set, "noep-nodeports"):
		if ip, p, port, ok := decodeVIPKey(f, key); ok {
			return fmt.Sprintf("%s . %s . %d", ip, p, port)
		}
	case strings.HasPrefix(set, "nodeports"), strings.HasPrefix(set, "noep-nodeports"):
		if p, port, ok := decodeProtoPortKey(key); ok {
			return fmt.Sprintf("%s . %d", p, port)
		}
	case strings.HasPrefix(set, "nodeport-ips"), strings.HasPrefix(set, "cluster-ips"):
		if a, ok := netip.AddrFromSlice(key); ok {
			return a.String()
		}
	case strings.HasPrefix(set, "endpoints"):
		if len(key) == 8 {
			return fmt.Sprintf("%d . %d", binary.BigEndian.Uint32(key), binaryutil.NativeEndian.Uint32(key[4:]))
		}
	case strings.HasPrefix(set, "hairpin"):
		n := len(key) / 2
		a, _ := netip.AddrFromSlice(key[:n])
		c, _ := netip.AddrFromSlice(key[n:])
		return fmt.Sprintf("%s . %s", a, c)
	}
	return "0x" + hex.EncodeToString(key)
}

func verdictString(v *expr.Verdict) string {
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
	}
	return fmt.Sprintf("verdict(%d)", v.Kind)
}

func (k *kernelTable) exprString(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		if e.SourceRegister {
			return fmt.Sprintf("[meta set %s reg %d]", metaName(e.Key), e.Register)
		}
		return fmt.Sprintf("[meta %s => reg %d]", metaName(e.Key), e.Register)
	case *expr.Cmp:
		op := "eq"
		if e.Op == expr.CmpOpNeq {
			op = "neq"
		}
		return fmt.Sprintf("[cmp %s reg %d 0x%s]", op, e.Register, hex.EncodeToString(e.Data))
	case *expr.Payload:
		base := "network"
		if e.Base == expr.PayloadBaseTransportHeader {
			base = "transport"
		}
		return fmt.Sprintf("[payload %db @ %s + %d => reg %d]", e.Len, base, e.Offset, e.DestRegister)
	case *expr.Bitwise:
		return fmt.Sprintf("[bitwise reg %d = (reg %d & 0x%s) ^ 0x%s]", e.DestRegister, e.SourceRegister, hex.EncodeToString(e.Mask), hex.EncodeToString(e.Xor))
	case *expr.Lookup:
		name := e.SetName
		if strings.HasPrefix(name, "__") {
			name = "{" + k.anonString(name) + "}"
		} else {
			name = "@" + name
		}
		neg := ""
		if e.Invert {
			neg = "!"
		}
		if e.IsDestRegSet {
			if e.DestRegister == 0 {
				return fmt.Sprintf("[vmap reg %d %s]", e.SourceRegister, name)
			}
			return fmt.Sprintf("[map reg %d %s => reg %d]", e.SourceRegister, name, e.DestRegister)
		}
		return fmt.Sprintf("[lookup %sreg %d %s]", neg, e.SourceRegister, name)
	case *expr.Verdict:
		return "[" + verdictString(e) + "]"
	case *expr.Counter:
		return "[counter]" // values are left out so that output is stable
	case *expr.Immediate:
		return fmt.Sprintf("[immediate reg %d 0x%s]", e.Register, hex.EncodeToString(e.Data))
	case *expr.NAT:
		return fmt.Sprintf("[dnat family %d addr reg %d port reg %d]", e.Family, e.RegAddrMin, e.RegProtoMin)
	case *expr.Numgen:
		return fmt.Sprintf("[numgen random mod %d => reg %d]", e.Modulus, e.Register)
	case *expr.Reject:
		return fmt.Sprintf("[reject type %d code %d]", e.Type, e.Code)
	case *expr.Masq:
		return "[masquerade fully-random]"
	case *expr.Ct:
		return fmt.Sprintf("[ct key %d => reg %d]", e.Key, e.Register)
	}
	return fmt.Sprintf("[%T]", e)
}

func (k *kernelTable) anonString(name string) string {
	var parts []string
	for _, el := range k.anon[name] {
		v := "0x" + hex.EncodeToString(el.Val)
		f := portal.IPv4
		if len(el.Val) > 8 {
			f = portal.IPv6
		}
		if ap, ok := decodeAddrPortVal(f, el.Val); ok {
			v = ap.String()
		}
		idx := uint32(0)
		if len(el.Key) == 4 {
			idx = binaryutil.NativeEndian.Uint32(el.Key)
		}
		parts = append(parts, fmt.Sprintf("%d: %s", idx, v))
	}
	return strings.Join(parts, ", ")
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	}
	return fmt.Sprintf("key%d", k)
}
