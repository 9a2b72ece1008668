package nft

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

var families = []portal.Family{portal.IPv4, portal.IPv6}

func addrType(f portal.Family) nftables.SetDatatype {
	if f == portal.IPv6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// fixedSets returns the named sets and maps of the table (empty).
func fixedSets(t *nftables.Table) []*nftables.Set {
	var sets []*nftables.Set
	for _, f := range families {
		vipType := nftables.MustConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService)
		ppType := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
		sets = append(sets,
			&nftables.Set{Table: t, Name: setVIPs(f), IsMap: true, Concatenation: true, KeyType: vipType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setNoEndpoints(f), IsMap: true, Concatenation: true, KeyType: vipType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setNodePorts(f), IsMap: true, Concatenation: true, KeyType: ppType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setNoEndpointsNP(f), IsMap: true, Concatenation: true, KeyType: ppType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setFirewall(f), IsMap: true, Concatenation: true, KeyType: vipType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setFirewallNP(f), IsMap: true, Concatenation: true, KeyType: ppType, DataType: nftables.TypeVerdict},
			&nftables.Set{Table: t, Name: setNodePortIPs(f), KeyType: addrType(f)},
			&nftables.Set{Table: t, Name: setClusterIPs(f), KeyType: addrType(f)},
			&nftables.Set{Table: t, Name: setServiceCIDRs(f), Interval: true, KeyType: addrType(f)},
			&nftables.Set{Table: t, Name: setPodDNAT(f), IsMap: true, KeyType: addrType(f), DataType: addrType(f)},
			&nftables.Set{Table: t, Name: setPodSNAT(f), IsMap: true, KeyType: addrType(f), DataType: addrType(f)},
			&nftables.Set{Table: t, Name: setExtMarks(f), Concatenation: true, KeyType: vipType},
			&nftables.Set{Table: t, Name: setNodePortMarks(f), Concatenation: true, KeyType: ppType},
			&nftables.Set{Table: t, Name: setHairpin(f), Concatenation: true, KeyType: nftables.MustConcatSetType(addrType(f), addrType(f))},
		)
		sets = append(sets, flatSets(t, f)...)
		for i := uint32(0); i < endpointShards; i++ {
			sets = append(sets, &nftables.Set{Table: t, Name: setEndpoints(f, i), IsMap: true, Concatenation: true,
				KeyType:  endpointKeyType,
				DataType: nftables.MustConcatSetType(addrType(f), nftables.TypeInetService)})
		}
	}
	return sets
}

type chainSpec struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority int32
}

var baseChains = []chainSpec{
	{chainNatPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, -100},
	{chainNatOutput, nftables.ChainTypeNAT, nftables.ChainHookOutput, -100},
	{chainNatPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, 100},
	{chainFilterInput, nftables.ChainTypeFilter, nftables.ChainHookInput, -10},
	{chainFilterForward, nftables.ChainTypeFilter, nftables.ChainHookForward, -10},
	{chainFilterOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, -10},
}

var regularChains = append([]string{chainServices, chainNoEndpoints, chainNoEndpointsNP, chainReject, chainDrop}, flatChains...)

// fixedRules returns the rules of the fixed chains, by chain name, in order.
func fixedRules(cfg dataplane.Config) map[string][][]expr.Any {
	mark := cfg.MasqueradeMark()
	r := map[string][][]expr.Any{}
	jump := func(c string) [][]expr.Any { return [][]expr.Any{{verdict(expr.VerdictJump, c)}} }
	r[chainNatPrerouting] = jump(chainServices)
	r[chainNatOutput] = jump(chainServices)
	noep := [][]expr.Any{append(matchCtState(expr.CtStateBitNEW), verdict(expr.VerdictJump, chainNoEndpoints))}
	// Node ports are checked on the way in only, as kube-proxy checks them
	// (its nodeport-endpoints-check, from filter-input): the node's own
	// datagram to its node port is refused there, not failed on output.
	r[chainFilterInput] = [][]expr.Any{noep[0], append(matchCtState(expr.CtStateBitNEW), verdict(expr.VerdictJump, chainNoEndpointsNP))}
	r[chainFilterForward] = noep
	r[chainFilterOutput] = noep

	var services, check, checkNP [][]expr.Any
	for _, f := range families {
		fm := matchFamily(f)
		if m := masqOutsideRule(cfg, f); m != nil {
			services = append(services, cat(fm, []expr.Any{loadAddr(f, true, reg1), lookup(setClusterIPs(f), false)}, m))
		}
		vip := cat(fm, loadVIPKey(f))
		vipGate, npGate, flat := flatRules(f)
		for name, rules := range flat {
			r[name] = rules
		}
		// Ways in behind source ranges jump to their Service's firewall
		// chain, which drops a client outside them, before the dispatch.
		services = append(services,
			cat(vip, []expr.Any{lookup(setExtMarks(f), false)}, setMarkBits(mark)),
			cat(vip, []expr.Any{vmap(setFirewall(f))}),
			cat(vip, []expr.Any{vmap(setVIPs(f))}),
			vipGate)
		check = append(check, cat(vip, []expr.Any{vmap(setNoEndpoints(f))}))
		np := cat(fm, []expr.Any{loadAddr(f, true, reg1), lookup(setNodePortIPs(f), false)}, loadProtoPort(unix.NFT_REG32_00))
		services = append(services,
			cat(np, []expr.Any{lookup(setNodePortMarks(f), false)}, setMarkBits(mark)),
			cat(np, []expr.Any{vmap(setFirewallNP(f))}),
			cat(np, []expr.Any{vmap(setNodePorts(f))}),
			npGate,
			// A pod's own external IP: every protocol and port, 1:1.
			cat(fm, []expr.Any{loadAddr(f, true, reg1),
				&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setPodDNAT(f)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto(f)), RegAddrMin: reg1}}))
		checkNP = append(checkNP, cat(np, []expr.Any{vmap(setNoEndpointsNP(f))}))
	}
	for _, f := range families {
		// Not DNATed and not in the no-endpoints maps: an undefined port of
		// a cluster IP (reject), or an unallocated address of a Service
		// CIDR (drop; the set's elements follow the ServiceCIDR objects,
		// see servicecidrs.go).
		check = append(check,
			cat(matchFamily(f), []expr.Any{loadAddr(f, true, reg1), lookup(setClusterIPs(f), false), verdict(expr.VerdictGoto, chainReject)}),
			cat(matchFamily(f), []expr.Any{loadAddr(f, true, reg1), lookup(setServiceCIDRs(f), false), counter(), verdict(expr.VerdictDrop, "")}))
	}
	r[chainServices] = services
	r[chainNoEndpoints] = check
	r[chainNoEndpointsNP] = checkNP
	r[chainDrop] = [][]expr.Any{{counter(), verdict(expr.VerdictDrop, "")}}
	r[chainReject] = [][]expr.Any{
		cat(matchL4Proto(portal.TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}},
	}

	var post [][]expr.Any
	for _, f := range families {
		// A pod with its own external IP leaves with it, except towards
		// the cluster and this node.
		r := matchFamily(f)
		for _, p := range cfg.ClusterCIDRs {
			if portal.FamilyOf(p.Addr()) == f {
				r = append(r, matchPrefix(f, true, p, expr.CmpOpNeq)...)
			}
		}
		r = append(r,
			&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
			loadAddr(f, false, unix.NFT_REG_2),
			&expr.Lookup{SourceRegister: unix.NFT_REG_2, DestRegister: unix.NFT_REG_2, IsDestRegSet: true, SetName: setPodSNAT(f)},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(nfproto(f)), RegAddrMin: unix.NFT_REG_2})
		post = append(post, r)
	}
	post = append(post, cat(matchMarkBits(mark), clearMarkBits(mark), []expr.Any{masquerade()}))
	for _, f := range families {
		post = append(post, cat(matchFamily(f), matchCtStatus(ipsDstNAT),
			[]expr.Any{loadAddr(f, false, reg1), loadAddr(f, true, reg32After(addrLen(f))), lookup(setHairpin(f), false), masquerade()}))
	}
	r[chainNatPostrouting] = post
	return r
}

// masqOutsideRule marks cluster-IP traffic of family f from outside the
// cluster CIDRs for masquerade (every packet with MasqueradeAll). It is
// inline, without a jump, so that rewriting a Service chain never makes the
// kernel re-validate the whole ruleset. nil when nothing is to be marked.
func masqOutsideRule(cfg dataplane.Config, f portal.Family) []expr.Any {
	mark := setMarkBits(cfg.MasqueradeMark())
	if cfg.MasqueradeAll {
		return mark
	}
	if !hasFamily(cfg.ClusterCIDRs, f) {
		return nil
	}
	var r []expr.Any
	for _, p := range cfg.ClusterCIDRs {
		if portal.FamilyOf(p.Addr()) == f {
			r = append(r, matchPrefix(f, false, p, expr.CmpOpNeq)...)
		}
	}
	return append(r, mark...)
}

func hasFamily(ps []netip.Prefix, f portal.Family) bool {
	for _, p := range ps {
		if portal.FamilyOf(p.Addr()) == f {
			return true
		}
	}
	return false
}

// matchPrefix: ip saddr|daddr within p (op eq) or outside it (op neq).
func matchPrefix(f portal.Family, dst bool, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	n := addrLen(f)
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		loadAddr(f, dst, reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(n), Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: reg1, Data: addrBytes(p.Addr())},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ipsDstNAT is the conntrack status bit of a destination-NATed connection.
const ipsDstNAT = 1 << 5
