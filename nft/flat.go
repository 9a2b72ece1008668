package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// This file holds the flat layout: the ways into a Service port that
// balances at random over 1 to maxFlat endpoints, with no policy that needs
// a chain of its own, are map elements only. A Service, an endpoint or an
// address change is then element updates, never a rule, chain or verdict
// element, so the kernel has nothing to re-validate, and the cost of one
// change does not grow with the number of Services.
//
// A way in is one element of the gate set, and one element per endpoint in
// the map of its endpoint count, keyed by the way in and the index numgen
// picks:
//
//	set flat-vips4 { 10.96.0.10 . tcp . 80 comment "cluster-ip svc4/demo/web/tcp/http" }
//	map flat4-02   { 10.96.0.10 . tcp . 80 . 0 comment "cluster-ip svc4/demo/web/tcp/http" : 10.244.2.2 . 8080,
//	                 10.96.0.10 . tcp . 80 . 1 comment "cluster-ip svc4/demo/web/tcp/http" : 10.244.3.2 . 8080 }
//
// The services chain sends a gated way in to a fixed chain that tries one
// map per endpoint count, the smallest first; a way in is in exactly one:
//
//	chain services
//	    ip daddr . meta l4proto . th dport @flat-vips4 goto flat4
//	chain flat4
//	    dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @flat4-01
//	    dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @flat4-02
//	    ...
//
// Node ports likewise, keyed by protocol . port (flat-nodeports4,
// flat-nodeports4-<N>). Every rule, set and map is fixed: created with the
// table, never changed. A new connection to a flat way in costs one lookup
// per endpoint count up to its own (at most maxFlat); traffic to anything
// else costs the gate's one lookup. An endpoint count change moves the way
// in's elements from one map to the other in the same transaction, 2N+1
// element updates. Ways in with ClientIP affinity, Maglev, source ranges,
// topology hints, a Local traffic policy's own chains, or more than maxFlat
// endpoints keep a chain per Service port (doc.go).

// maxFlat is the largest endpoint count the flat maps take: each count has
// a rule that every new connection to a larger one tries first.
const maxFlat = 16

func setFlatGate(f portal.Family) string   { return "flat-vips" + fam(f) }
func setFlatGateNP(f portal.Family) string { return "flat-nodeports" + fam(f) }
func chainFlat(f portal.Family) string     { return "flat" + fam(f) }
func chainFlatNP(f portal.Family) string   { return "flat-nodeports" + fam(f) }
func setFlat(f portal.Family, n int) string {
	return fmt.Sprintf("flat%s-%02d", fam(f), n)
}
func setFlatNP(f portal.Family, n int) string {
	return fmt.Sprintf("flat-nodeports%s-%02d", fam(f), n)
}

// flatChains are the fixed chains of the flat layout.
var flatChains = []string{chainFlat(portal.IPv4), chainFlatNP(portal.IPv4), chainFlat(portal.IPv6), chainFlatNP(portal.IPv6)}

// isFlatMap: one of the maps of flat endpoints.
func isFlatMap(name string) bool {
	for _, f := range families {
		for _, prefix := range []string{chainFlat(f) + "-", chainFlatNP(f) + "-"} {
			if len(name) == len(prefix)+2 && name[:len(prefix)] == prefix {
				return true
			}
		}
	}
	return false
}

// isFlatGate: one of the gate sets, whose elements are flat ways in.
func isFlatGate(name string) bool {
	for _, f := range families {
		if name == setFlatGate(f) || name == setFlatGateNP(f) {
			return true
		}
	}
	return false
}

// flatBody: a chain with this body can be flat elements instead.
func flatBody(b chainBody) bool {
	return b.shortCircuit == "" && b.affinity == 0 && !b.maglev && !b.dropIfEmpty && b.topology == "" &&
		len(b.endpoints) >= 1 && len(b.endpoints) <= maxFlat
}

// flatten turns o's ways in whose chain can be flat into gate and map
// elements, and drops the chains nothing refers to any more. The elements
// of one way in are owned together, under the id its dispatch element
// would have (so that a way in two portals want is one conflict, flat or
// not). A portal with source ranges keeps its chains: its firewall
// elements guard the dispatch elements.
func flatten(o *objects) {
	if o.rangeSet != "" {
		return
	}
	flatWay := func(e elem) (chainBody, bool, bool) {
		body, ok := o.chains[e.chain]
		if !ok || e.jump || !flatBody(body) {
			return body, false, false
		}
		np := e.set == setNodePorts(body.family)
		return body, np, np || e.set == setVIPs(body.family)
	}
	extra := 0
	for _, e := range o.elems {
		if body, _, ok := flatWay(e); ok {
			extra += len(body.endpoints) + 1
		}
	}
	if extra == 0 {
		return
	}
	out := make([]elem, 0, len(o.elems)+extra)
	flat := map[string]bool{}
	for _, e := range o.elems {
		body, np, ok := flatWay(e)
		if !ok {
			out = append(out, e)
			continue
		}
		f, n := body.family, len(body.endpoints)
		gate, m := setFlatGate(f), setFlat(f, n)
		if np {
			gate, m = setFlatGateNP(f), setFlatNP(f, n)
		}
		owner := e.id()
		out = append(out, elem{set: gate, key: e.key, comment: e.comment, owner: owner})
		for i, ep := range body.endpoints {
			out = append(out, elem{set: m, key: e.key + string(numgenKey(uint32(i))), val: string(addrPortVal(ep)),
				comment: e.comment, owner: owner})
		}
		flat[e.chain] = true
	}
	o.elems = out
	for _, e := range out {
		delete(flat, e.chain) // still the target of a dispatch element
	}
	for _, b := range o.chains {
		delete(flat, b.shortCircuit)
	}
	for name := range flat {
		delete(o.chains, name)
	}
}

// flatSets are the fixed gate sets and maps of family f.
func flatSets(t *nftables.Table, f portal.Family) []*nftables.Set {
	vipType := nftables.MustConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService)
	ppType := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	data := nftables.MustConcatSetType(addrType(f), nftables.TypeInetService)
	sets := []*nftables.Set{
		{Table: t, Name: setFlatGate(f), Concatenation: true, KeyType: vipType},
		{Table: t, Name: setFlatGateNP(f), Concatenation: true, KeyType: ppType},
	}
	for n := 1; n <= maxFlat; n++ {
		sets = append(sets, &nftables.Set{Table: t, Name: setFlat(f, n), IsMap: true, Concatenation: true,
			KeyType: flatKeyType(f), DataType: data})
	}
	for n := 1; n <= maxFlat; n++ {
		sets = append(sets, &nftables.Set{Table: t, Name: setFlatNP(f, n), IsMap: true, Concatenation: true,
			KeyType: flatNPKeyType, DataType: data})
	}
	return sets
}

// The keys of the flat maps: the way in . the index numgen picks.
var (
	flatKeyType4  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
	flatKeyType6  = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
	flatNPKeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
)

func flatKeyType(f portal.Family) nftables.SetDatatype {
	if f == portal.IPv6 {
		return flatKeyType6
	}
	return flatKeyType4
}

// flatMapUdata is the user data of a flat map, as nft writes it for
// typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport
// (without the address for the node ports' maps).
func flatMapUdata(s *nftables.Set) udata {
	addr := typeofPayload(protoDescIP, 12)
	if nftables.ConcatSetTypeElements(s.DataType)[0].GetNFTMagic() == nftables.TypeIP6Addr.GetNFTMagic() {
		addr = typeofPayload(protoDescIP6, 9)
	}
	key := []typeofExpr{typeofMeta(unix.NFT_META_L4PROTO), typeofPayload(protoDescTH, 2), typeofNumgenRandom(1)}
	if s.KeyType.Name != flatNPKeyType.Name {
		key = append([]typeofExpr{addr}, key...)
	}
	return udata(nil).
		u32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), byteOrderInvalid).
		u32(byte(userdata.NFTNL_UDATA_SET_DATABYTEORDER), byteOrderInvalid).
		nest(byte(userdata.NFTNL_UDATA_SET_KEY_TYPEOF), typeofConcat(key...).records()).
		nest(byte(userdata.NFTNL_UDATA_SET_DATA_TYPEOF), typeofConcat(addr, typeofPayload(protoDescTH, 2)).records()).
		u32(udataDataInterval, 0)
}

// isFlatKeyType: s is keyed as a flat map is.
func isFlatKeyType(s *nftables.Set) bool {
	switch s.KeyType.Name {
	case flatKeyType4.Name, flatKeyType6.Name, flatNPKeyType.Name:
		return s.IsMap && !isVerdictType(s.DataType)
	}
	return false
}

// flatRules are the rules of the fixed chains of family f's flat layout,
// by chain, and the services chain's two gates.
func flatRules(f portal.Family) (vipGate, npGate []expr.Any, chains map[string][][]expr.Any) {
	fm := matchFamily(f)
	vipGate = cat(fm, loadVIPKey(f), []expr.Any{lookup(setFlatGate(f), false), verdict(expr.VerdictGoto, chainFlat(f))})
	npGate = cat(fm, []expr.Any{loadAddr(f, true, reg1), lookup(setNodePortIPs(f), false)}, loadProtoPort(unix.NFT_REG32_00),
		[]expr.Any{lookup(setFlatGateNP(f), false), verdict(expr.VerdictGoto, chainFlatNP(f))})
	chains = map[string][][]expr.Any{}
	idx := reg32After(addrLen(f)) + 2 // after ip daddr . meta l4proto . th dport
	for n := 1; n <= maxFlat; n++ {
		chains[chainFlat(f)] = append(chains[chainFlat(f)], cat(fm, loadVIPKey(f), []expr.Any{
			&expr.Numgen{Register: idx, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setFlat(f, n)},
			dnatFrom(f, reg1)}))
		chains[chainFlatNP(f)] = append(chains[chainFlatNP(f)], cat(fm, loadProtoPort(unix.NFT_REG32_00), []expr.Any{
			&expr.Numgen{Register: unix.NFT_REG32_02, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setFlatNP(f, n)},
			dnatFrom(f, reg1)}))
	}
	return vipGate, npGate, chains
}
