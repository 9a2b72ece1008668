package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// This file builds the per-portal chains: their rules, the affinity sets
// and chains they use, and their elements in the endpoint maps.

// pendingRule is a rule of a per-portal chain, with the anonymous map it
// uses (created only when the rule is sent).
type pendingRule struct {
	exprs     []expr.Any
	anon      *nftables.Set
	anonElems []nftables.SetElement
}

// chainRules writes the rules of a per-portal chain, and its endpoints
// into the family's endpoint maps. In a full sync that reconciles in place,
// a chain the kernel already holds with the same rules is left as it is
// (its counters too), and one with other rules is flushed and rewritten.
func (t *tx) chainRules(name string, body chainBody) {
	var id uint32
	if body.usesEndpointMap() {
		id = t.b.chainID(name)
	}
	var rules []pendingRule
	add := func(e []expr.Any) { rules = append(rules, pendingRule{exprs: e}) }
	defer func() { t.emitRules(name, rules, t.b.bodyTag(id, body)) }()
	f := body.family
	markBits := t.b.cfg.MasqueradeMark()
	if body.shortCircuit != "" {
		for _, p := range t.b.cfg.ClusterCIDRs {
			if portal.FamilyOf(p.Addr()) == f {
				add(cat(matchFamily(f), matchPrefix(f, false, p, expr.CmpOpEq), []expr.Any{verdict(expr.VerdictGoto, body.shortCircuit)}))
			}
		}
		add(cat(matchLocalSource(), setMarkBits(markBits), []expr.Any{verdict(expr.VerdictGoto, body.shortCircuit)}))
	}
	switch n := len(body.endpoints); {
	case n == 0:
		if body.dropIfEmpty {
			add([]expr.Any{counter(), verdict(expr.VerdictDrop, "")})
		}
	default:
		if body.affinity > 0 {
			rules = append(rules, t.affinityRules(name, body)...)
			return
		}
		if body.maglev {
			// dnat to id . jhash <5-tuple> mod <size> map @endpoints<f>-<shard>
			add(maglevRule(f, id, body.tableSize()))
		} else {
			// dnat to id . numgen random mod N map @endpoints<f>-<shard>
			add([]expr.Any{counter(),
				loadChainID(id),
				&expr.Numgen{Register: reg32After(4), Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setEndpoints(f, id)},
				dnatFrom(f, reg1)})
		}
		for i, ep := range body.slots() {
			t.addEndpoint(name, f, id, i, ep)
		}
	}
}

// emitRules sends the rules of chain, tagged, unless a full sync finds the
// kernel holding them already.
func (t *tx) emitRules(chain string, rules []pendingRule, tag []byte) {
	if k := t.kernel; k != nil && k.chains[chain] {
		if k.rules[chain] == len(rules) && (len(rules) == 0 || bytes.Equal(k.tags[chain], tag)) {
			return
		}
		if k.rules[chain] > 0 {
			t.conn.FlushChain(&nftables.Chain{Name: chain, Table: t.b.table})
			t.stats.Messages++
		}
	}
	ch := &nftables.Chain{Name: chain, Table: t.b.table}
	for _, r := range rules {
		exprs := r.exprs
		if r.anon != nil {
			if err := t.addSet(r.anon, r.anonElems); err != nil {
				t.err = err
				return
			}
			t.stats.Messages += 2
			exprs = append(exprs, &expr.Lookup{SourceRegister: reg1, IsDestRegSet: true, SetName: r.anon.Name, SetID: r.anon.ID})
		}
		t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, Exprs: exprs, UserData: tag})
		t.stats.Messages++
	}
}

func dnatFrom(f portal.Family, reg uint32) *expr.NAT {
	// reg holds addr . port; reg1 is reg32_00 for the purpose of offsets.
	start := reg
	if reg == reg1 {
		start = unix.NFT_REG32_00
	}
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto(f)), RegAddrMin: reg,
		RegProtoMin: start + uint32(addrLen(f)/4)}
}

// affinityRules: a client seen within the timeout goes back to its
// endpoint; a new one is sent to a random endpoint, whose chain remembers it.
// Rules per endpoint, as kube-proxy: only Services with affinity pay for it.
// It returns the rules of chain name; the per-endpoint sets and chains are
// created (or, when the timeout changed, their rule rewritten) here.
func (t *tx) affinityRules(name string, body chainBody) []pendingRule {
	f := body.family
	objs := body.affinityObjects(name)
	if len(body.endpoints) == 1 {
		// The only endpoint: the client is remembered for the portal's
		// other chains and for the endpoints to come.
		ep := body.endpoints[0]
		t.affinityEndpoint(f, objs[ep][0], objs[ep][1], ep, body.affinity)
		return []pendingRule{{exprs: []expr.Any{verdict(expr.VerdictGoto, objs[ep][1])}}}
	}
	var rules []pendingRule
	var vmElems []nftables.SetElement
	for i, ep := range body.endpoints {
		setName, chain := objs[ep][0], objs[ep][1]
		t.affinityEndpoint(f, setName, chain, ep, body.affinity)
		rules = append(rules, pendingRule{exprs: cat(matchFamily(f), []expr.Any{loadAddr(f, false, reg1), lookup(setName, false), verdict(expr.VerdictGoto, chain)})})
		vmElems = append(vmElems, nftables.SetElement{Key: numgenKey(uint32(i)), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}})
	}
	vm := &nftables.Set{Table: t.b.table, Anonymous: true, Constant: true, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	return append(rules, pendingRule{
		exprs:     []expr.Any{&expr.Numgen{Register: reg1, Modulus: uint32(len(body.endpoints)), Type: unix.NFT_NG_RANDOM}},
		anon:      vm,
		anonElems: vmElems,
	})
}

// affinityEndpoint makes sure the set of clients stuck to ep and the chain
// that remembers them exist, with the chain refreshing entries for timeout
// seconds. The set keeps its clients when the timeout changes: only the
// chain's rule is rewritten, and each client gets the new timeout the next
// time it is seen.
func (t *tx) affinityEndpoint(f portal.Family, setName, chain string, ep netip.AddrPort, timeout uint32) {
	if _, done := t.newAff[setName]; done {
		return
	}
	tag := ruleTag(0, fmt.Sprintf("aep|%s|%d", ep, timeout))
	haveSet, haveChain, same := false, false, false
	if k := t.kernel; k != nil {
		haveSet, haveChain = k.sets[setName] != nil, k.chains[chain]
		same = haveChain && k.rules[chain] == 1 && bytes.Equal(k.tags[chain], tag)
	} else if old, ok := t.b.affSets[setName]; ok {
		haveSet, haveChain, same = true, true, old == timeout
	}
	t.newAff[setName] = timeout
	if same && haveSet {
		return
	}
	d := time.Duration(timeout) * time.Second
	if !haveSet {
		set := &nftables.Set{Table: t.b.table, Name: setName, HasTimeout: true, Dynamic: true, Timeout: d, KeyType: addrType(f)}
		if err := t.addSet(set, nil); err != nil {
			t.err = err
			return
		}
		t.stats.Messages++
	}
	ch := &nftables.Chain{Name: chain, Table: t.b.table}
	if haveChain {
		t.conn.FlushChain(ch)
	} else {
		t.conn.AddChain(ch)
	}
	al := addrLen(f)
	t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, UserData: tag, Exprs: cat(matchFamily(f), []expr.Any{
		loadAddr(f, false, reg1),
		&expr.Dynset{SrcRegKey: reg1, SetName: setName, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: d},
		counter(),
		&expr.Immediate{Register: reg1, Data: addrBytes(ep.Addr())},
		&expr.Immediate{Register: reg32After(al), Data: portBytes(ep.Port())},
		dnatFrom(f, reg1),
	})})
	t.stats.Messages += 2
}

// addEndpoint adds element i of chain's endpoints (its id . i : ep), with
// the chain's name as its comment, which says whose endpoint it is.
func (t *tx) addEndpoint(chain string, f portal.Family, id uint32, i int, ep netip.AddrPort) {
	s := setEndpoints(f, id)
	t.addElems[s] = append(t.addElems[s], nftables.SetElement{Key: epKey(id, i), Val: addrPortVal(ep), Comment: chain})
}

func (t *tx) delEndpoint(f portal.Family, id uint32, i int) {
	s := setEndpoints(f, id)
	t.delElems[s] = append(t.delElems[s], nftables.SetElement{Key: epKey(id, i)})
}

// dropEndpoints deletes the endpoint-map elements of a chain's old body.
func (t *tx) dropEndpoints(name string, old chainBody) {
	if !old.usesEndpointMap() {
		return // no endpoint-map elements
	}
	id := t.b.chainID(name)
	for i := range old.slots() {
		t.delEndpoint(old.family, id, i)
	}
}

// updateEndpoints replaces the endpoint-map elements that differ: the
// most common change (a pod replaced) touches no rule. For a Maglev chain
// these are the slots whose endpoint changed, about 1/N of them when one
// of N endpoints comes or goes.
func (t *tx) updateEndpoints(name string, old, body chainBody) {
	id := t.b.chainID(name)
	was := old.slots()
	for i, ep := range body.slots() {
		if was[i] == ep {
			continue
		}
		t.delEndpoint(body.family, id, i)
		t.addEndpoint(name, body.family, id, i, ep)
	}
}
