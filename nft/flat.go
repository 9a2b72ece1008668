package nft

import (
	"fmt"
	"strings"

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

// flatReadBackMax bounds the flat elements a full sync reads back from the
// kernel. The kernel's dump of a set restarts its walk from the first
// element for every batch of about 300 elements it sends, so reading a map
// costs the square of its size, and the flat maps are few and large (100k
// elements in one at 10k Services x 10 endpoints: 2 s). Beyond the bound a
// full sync that reads the table back (a restart, a repair) empties the
// flat maps and writes them anew in its transaction, which costs their
// size: the ways in answer throughout, since the transaction is atomic.
// Below it, a restart over an untouched table sends nothing.
const flatReadBackMax = 8192

// maxFlat is the largest endpoint count the flat maps take: each count has
// a rule that every new connection to a larger one tries first.
const maxFlat = 16

func setFlatGate(f portal.Family) string   { return "flat-vips" + fam(f) }
func setFlatGateNP(f portal.Family) string { return "flat-nodeports" + fam(f) }
func chainFlat(f portal.Family) string     { return "flat" + fam(f) }
func chainFlatNP(f portal.Family) string   { return "flat-nodeports" + fam(f) }
func setFlat(f portal.Family, n int) string {
	return flatNames[familyIndex(f)][0][n]
}
func setFlatNP(f portal.Family, n int) string {
	return flatNames[familyIndex(f)][1][n]
}

func familyIndex(f portal.Family) int {
	if f == portal.IPv6 {
		return 1
	}
	return 0
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

// flatten turns o's ways in whose chain can be flat into gate elements
// that carry their endpoints (the map elements are made from them when
// they are sent: flatAdd), and drops the chains nothing refers to any
// more. A gate element is owned under the id its dispatch element would
// have, so that a way in two portals want is one conflict, flat or not;
// its map elements follow it. A portal with source ranges keeps its
// chains: its firewall elements guard the dispatch elements.
func flatten(o *objects) {
	if o.rangeSet != "" {
		return
	}
	flat := map[string]bool{}
	for i, e := range o.elems {
		body, ok := o.chains[e.chain]
		if !ok || e.jump || !flatBody(body) {
			continue
		}
		f := body.family
		gate := setFlatGate(f)
		switch e.set {
		case setVIPs(f):
		case setNodePorts(f):
			gate = setFlatGateNP(f)
		default:
			continue
		}
		o.elems[i] = elem{set: gate, key: e.key, comment: e.comment, eps: body.endpoints}
		flat[e.chain] = true
	}
	if len(flat) == 0 {
		return
	}
	for _, e := range o.elems {
		delete(flat, e.chain) // still the target of a dispatch element
	}
	for _, b := range o.chains {
		delete(flat, b.shortCircuit)
	}
	for name := range flat {
		delete(o.chains, name)
	}
}

// flatNames holds the names of the flat maps by family, kind (0: addresses,
// 1: node ports) and endpoint count, made once: a full sync names one per
// element it sends.
var flatNames = func() (n [2][2][maxFlat + 1]string) {
	for fi, f := range families {
		for c := 1; c <= maxFlat; c++ {
			n[fi][0][c] = fmt.Sprintf("flat%s-%02d", fam(f), c)
			n[fi][1][c] = fmt.Sprintf("flat-nodeports%s-%02d", fam(f), c)
		}
	}
	return n
}()

// flatMapOf is the map of a gate element's endpoints.
func flatMapOf(e elem) string {
	fi, kind := 0, 0
	if strings.HasSuffix(e.set, "6") {
		fi = 1
	}
	if strings.HasPrefix(e.set, "flat-nodeports") {
		kind = 1
	}
	return flatNames[fi][kind][len(e.eps)]
}

// flatElem is the map element of a gate element's endpoint i.
func flatElem(e elem, i int, add bool) nftables.SetElement {
	el := nftables.SetElement{Key: append([]byte(e.key), numgenKey(uint32(i))...)}
	if add {
		el.Val, el.Comment = addrPortVal(e.eps[i]), e.comment
	}
	return el
}

// flatAdd sends the map elements of gate element e, and flatDel deletes them.
func (t *tx) flatAdd(e elem) {
	m := flatMapOf(e)
	for i := range e.eps {
		t.addElems[m] = append(t.addElems[m], flatElem(e, i, true))
	}
}

func (t *tx) flatDel(e elem) {
	m := flatMapOf(e)
	for i := range e.eps {
		t.delElems[m] = append(t.delElems[m], flatElem(e, i, false))
	}
}

// flatUpdate replaces the map elements of a way in whose endpoints went
// from old's to n's: one element per endpoint replaced while the count
// stays (a pod replaced: one delete, one add), all of them when it moves
// to another count's map.
func (t *tx) flatUpdate(old, n elem) {
	if len(old.eps) != len(n.eps) {
		t.flatDel(old)
		t.flatAdd(n)
		return
	}
	m := flatMapOf(n)
	for i := range n.eps {
		if old.eps[i] != n.eps[i] {
			t.delElems[m] = append(t.delElems[m], flatElem(old, i, false))
			t.addElems[m] = append(t.addElems[m], flatElem(n, i, true))
		}
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

// waysIn counts a portal's ways in: its addresses and its node port.
func waysIn(p *portal.Portal) int {
	n := len(p.ClusterIPs) + len(p.ExternalIPs) + len(p.LoadBalancerIPs)
	if p.NodePort != 0 {
		n++
	}
	return n
}
