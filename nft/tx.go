package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// elemChunkBytes bounds the size of the element list in one netlink
// message: a nested attribute's length is 16 bits, and an overflow would
// silently truncate the list.
const elemChunkBytes = 48 << 10

// tx collects one sync's changes: kernel operations in the order the kernel
// needs them, and the in-memory state to adopt if the kernel accepts them.
type tx struct {
	b    *Backend
	conn *nftables.Conn
	// sender, when set, takes the transaction's set elements as messages
	// of onehop's own (elemMessage), between the library's.
	sender *batchSender
	full   bool

	services  map[portal.ServiceKey]*appliedService // nil value: deleted
	owners    map[string]*portal.PortKey            // nil value: released
	refD      map[string]int                        // shared element id -> change of its reference count
	npIPs     []netip.Addr
	npChanged bool
	podIPs    []portal.PodExternalIP
	podIPsSet bool
	// svcCIDRs are the ranges of the service-cidrs sets after this sync,
	// when svcCIDRsSet.
	svcCIDRs    []netip.Prefix
	svcCIDRsSet bool

	newChains []string
	bodies    map[string]chainBody
	oldBodies map[string]chainBody // of rewritten and deleted chains
	newAff    map[string]uint32    // affinity maps created, re-timed or (full sync) kept -> timeout
	delAff    [][2]string          // affinity sets and chains deleted
	// kernel is the table as read by a full sync that reconciles in place
	// (nil otherwise): what it holds already is not sent again.
	kernel      *kernelState
	fullElems   int      // elements a full sync leaves in the table
	delLeftover []string // chains in the kernel that nothing wants
	delSets     []string // affinity sets in the kernel that nothing wants
	// rangeSets are the Services' sets of source ranges this sync creates,
	// refills or deletes, by name.
	rangeSets map[string]rangeSetChange
	err       error
	rewrite   map[string]bool // existing chains whose rules are replaced
	delChains []string
	addElems  map[string][]nftables.SetElement
	delElems  map[string][]nftables.SetElement

	stats     dataplane.SyncStats
	conflicts int
	// waiting are elements another portal owned when their portal was
	// diffed; they are added at commit if that portal let them go.
	waiting []waitingElem
}

type waitingElem struct {
	pk portal.PortKey
	e  elem
}

// claimWaiting adds the waiting elements whose owner let them go in this
// sync, in the order they were asked for; the others are conflicts.
func (t *tx) claimWaiting() {
	for _, w := range t.waiting {
		if own, ok := t.otherOwner(w.pk, w.e); ok {
			t.conflicts++
			t.b.log.Warn("address already used by another service port; skipped",
				"portal", w.pk.String(), "owner", own.String(), "set", w.e.set)
			continue
		}
		t.addElems[w.e.set] = append(t.addElems[w.e.set], t.element(w.e, true))
		key := w.pk
		t.owners[w.e.id()] = &key
	}
}

func (b *Backend) newTx(conn *nftables.Conn, full bool) *tx {
	return &tx{
		b: b, conn: conn, full: full,
		services:  map[portal.ServiceKey]*appliedService{},
		owners:    map[string]*portal.PortKey{},
		refD:      map[string]int{},
		bodies:    map[string]chainBody{},
		oldBodies: map[string]chainBody{},
		newAff:    map[string]uint32{},
		rewrite:   map[string]bool{},
		addElems:  map[string][]nftables.SetElement{},
		delElems:  map[string][]nftables.SetElement{},
		rangeSets: map[string]rangeSetChange{},
	}
}

// presize gives a full sync's maps and element lists their size up front.
// A table of 10k Services x 10 endpoints has 100k endpoint elements and
// about 40k addresses and ports: grown by doubling, their lists and maps
// were copied and collected again and again, about a fifth of the sync's
// allocations.
func (t *tx) presize(snap *portal.Snapshot) {
	n := len(snap.Services)
	t.services = make(map[portal.ServiceKey]*appliedService, n)
	t.bodies = make(map[string]chainBody, n)
	t.owners = make(map[string]*portal.PortKey, 4*n)
	var eps, vips [2]int // endpoints and cluster IP ports per family
	for _, svc := range snap.Services {
		for _, p := range svc.Portals {
			i := 0
			if p.Key.Family == portal.IPv6 {
				i = 1
			}
			eps[i] += len(p.ClusterEndpoints)
			vips[i] += len(p.ClusterIPs)
		}
	}
	for i, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		if vips[i] > 0 { // each goes to its chain, or to drop or reject
			t.addElems[setVIPs(f)] = make([]nftables.SetElement, 0, vips[i])
		}
		if eps[i] == 0 {
			continue
		}
		per := eps[i]/endpointShards + eps[i]/endpointShards/4 + 8 // ids spread unevenly
		for shard := range uint32(endpointShards) {
			t.addElems[setEndpoints(f, shard)] = make([]nftables.SetElement, 0, per)
		}
	}
}

func (t *tx) oldService(k portal.ServiceKey) *appliedService {
	if t.full {
		return nil
	}
	return t.b.services[k]
}

// otherOwner returns the portal other than pk that owns e or, for a
// firewall element, the way in it guards: a way in another portal holds
// is never checked against pk's source ranges.
func (t *tx) otherOwner(pk portal.PortKey, e elem) (portal.PortKey, bool) {
	if own, ok := t.owner(e.id()); ok && own != pk {
		return own, true
	}
	if ids, ok := firewallGuard(e); ok {
		var other portal.PortKey
		for _, id := range ids {
			if own, ok := t.owner(id); ok {
				if own == pk {
					return portal.PortKey{}, false
				}
				other = own
			}
		}
		return other, true
	}
	return portal.PortKey{}, false
}

func (t *tx) owner(id string) (portal.PortKey, bool) {
	if o, ok := t.owners[id]; ok {
		if o == nil {
			return portal.PortKey{}, false
		}
		return *o, true
	}
	if t.full {
		return portal.PortKey{}, false
	}
	o, ok := t.b.owners[id]
	return o, ok
}

// renderService renders every portal of svc (nil: none).
func (t *tx) renderService(svc *portal.Service) map[portal.PortKey]*objects {
	objs := map[portal.PortKey]*objects{}
	if svc != nil {
		for _, p := range svc.Portals {
			objs[p.Key] = render(p, t.b.cfg)
		}
	}
	return objs
}

// serviceRendered diffs one Service against what was applied, with svc's
// portals already rendered (rendered nil: render them here).
func (t *tx) serviceRendered(k portal.ServiceKey, svc *portal.Service, rendered map[portal.PortKey]*objects) {
	old := t.oldService(k)
	if old == nil && svc == nil {
		return
	}
	if old != nil && svc != nil && (old.svc == svc || old.svc.Equal(svc)) {
		t.services[k] = &appliedService{svc: svc, objs: old.objs}
		return
	}
	var oldObjs map[portal.PortKey]*objects
	if old != nil {
		oldObjs = old.objs
	}
	newObjs := rendered
	if newObjs == nil {
		newObjs = t.renderService(svc)
	}
	keys := make([]portal.PortKey, 0, len(oldObjs)+len(newObjs))
	for pk := range oldObjs {
		keys = append(keys, pk)
	}
	for pk := range newObjs {
		if _, ok := oldObjs[pk]; !ok {
			keys = append(keys, pk)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, pk := range keys {
		t.portal(pk, oldObjs[pk], newObjs[pk])
	}
	t.diffRangeSets(oldObjs, newObjs)
	if svc == nil {
		t.services[k] = nil
	} else {
		t.services[k] = &appliedService{svc: svc, objs: newObjs}
	}
}

var emptyObjects = &objects{}

func (t *tx) portal(pk portal.PortKey, o, n *objects) {
	if o == nil {
		o = emptyObjects
	}
	if n == nil {
		n = emptyObjects
	}
	changed := false
	// The affinity sets and chains are the portal's, shared by its
	// chains: they go when no chain of the portal wants them any more.
	if keep, had := n.affinityObjects(), o.affinityObjects(); len(had) > 0 {
		for names := range had {
			if !keep[names] {
				t.delAff = append(t.delAff, names) // set, chain
			}
		}
	}
	for name := range o.chains {
		if _, ok := n.chains[name]; !ok {
			t.delChains = append(t.delChains, name)
			t.oldBodies[name] = o.chains[name]
			changed = true
		}
	}
	for name, body := range n.chains {
		ob, ok := o.chains[name]
		switch {
		case !ok:
			t.newChains = append(t.newChains, name)
			t.bodies[name] = body
			changed = true
		case ob.equal(body):
		case ob.sameRules(body) && body.usesEndpointMap():
			t.updateEndpoints(name, ob, body)
			changed = true
		default:
			t.rewrite[name] = true
			t.oldBodies[name] = ob
			t.bodies[name] = body
			changed = true
		}
	}
	var newByID map[string]elem
	if len(o.elems) > 0 {
		newByID = make(map[string]elem, len(n.elems))
		for _, e := range n.elems {
			newByID[e.id()] = e
		}
	}
	for _, e := range o.elems {
		if ne, ok := newByID[e.id()]; ok && ne.chain == e.chain {
			continue
		}
		if own, ok := t.owner(e.id()); ok && own == pk {
			t.delElems[e.set] = append(t.delElems[e.set], t.element(e, false))
			t.owners[e.id()] = nil
			changed = true
		}
	}
	var oldByID map[string]elem
	if len(o.elems) > 0 {
		oldByID = make(map[string]elem, len(o.elems))
		for _, e := range o.elems {
			oldByID[e.id()] = e
		}
	}
	owner := &pk // one for all the elements this portal takes
	for _, e := range n.elems {
		id := e.id()
		oe, had := oldByID[id]
		if had && oe.chain == e.chain {
			continue
		}
		if _, ok := t.otherOwner(pk, e); ok {
			// The owner may let it go later in this sync (an address
			// handed from one Service to another): decided at commit.
			t.waiting = append(t.waiting, waitingElem{pk, e})
			continue
		}
		t.addElems[e.set] = append(t.addElems[e.set], t.element(e, true))
		t.owners[id] = owner
		changed = true
	}
	for _, e := range o.shared {
		t.refD[e.id()]--
	}
	for _, e := range n.shared {
		t.refD[e.id()]++
	}
	if changed {
		t.stats.Changed++
	}
}

func (t *tx) element(e elem, add bool) nftables.SetElement {
	el := nftables.SetElement{Key: []byte(e.key)}
	if add {
		el.Comment = e.comment
	}
	if e.chain != "" && add {
		kind := expr.VerdictGoto
		if e.jump {
			kind = expr.VerdictJump
		}
		el.VerdictData = &expr.Verdict{Kind: kind, Chain: e.chain}
	}
	return el
}

func (t *tx) nodePortIPs(addrs []netip.Addr) {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	var old []netip.Addr
	if !t.full {
		old = t.b.npIPs
	}
	if slices.Equal(old, addrs) && !t.full {
		return
	}
	for _, a := range old {
		if !slices.Contains(addrs, a) {
			s := setNodePortIPs(portal.FamilyOf(a))
			t.delElems[s] = append(t.delElems[s], nftables.SetElement{Key: addrBytes(a)})
		}
	}
	for _, a := range addrs {
		if a.IsLoopback() || !a.IsValid() {
			continue // NodePorts are never served on loopback
		}
		if !slices.Contains(old, a) {
			s := setNodePortIPs(portal.FamilyOf(a))
			t.addElems[s] = append(t.addElems[s], nftables.SetElement{Key: addrBytes(a)})
		}
	}
	t.npIPs = addrs
	t.npChanged = true
}

// podExternalIPs diffs the pod external IP maps.
func (t *tx) podExternalIPs(ips []portal.PodExternalIP) {
	var old []portal.PodExternalIP
	if !t.full {
		old = t.b.podIPs
	}
	if !t.full && slices.Equal(old, ips) {
		return
	}
	for _, p := range old {
		if !slices.Contains(ips, p) {
			f := portal.FamilyOf(p.External)
			t.delElems[setPodDNAT(f)] = append(t.delElems[setPodDNAT(f)], nftables.SetElement{Key: addrBytes(p.External)})
			t.delElems[setPodSNAT(f)] = append(t.delElems[setPodSNAT(f)], nftables.SetElement{Key: addrBytes(p.Pod)})
		}
	}
	seenPod := map[netip.Addr]bool{}
	for _, p := range ips {
		if seenPod[p.Pod] {
			t.b.log.Warn("pod has more than one external IP; only the first is used", "pod", p.Name.String(), "ip", p.External)
			continue
		}
		seenPod[p.Pod] = true
		if slices.Contains(old, p) {
			continue
		}
		f := portal.FamilyOf(p.External)
		t.addElems[setPodDNAT(f)] = append(t.addElems[setPodDNAT(f)], nftables.SetElement{Key: addrBytes(p.External), Val: addrBytes(p.Pod)})
		t.addElems[setPodSNAT(f)] = append(t.addElems[setPodSNAT(f)], nftables.SetElement{Key: addrBytes(p.Pod), Val: addrBytes(p.External)})
	}
	t.podIPs, t.podIPsSet = ips, true
}

// writeFixed creates the table with its fixed chains and sets, when the
// kernel has none; with replace, it replaces a table the kernel holds as a
// whole, atomically: add (so that the delete cannot fail), delete, and
// re-create. Replacing drops every affinity entry and counter: it is only
// for a table that cannot be reconciled in place.
func (t *tx) writeFixed(replace bool) error {
	c, tb := t.conn, t.b.table
	c.AddTable(tb)
	if replace {
		c.DelTable(tb)
		c.AddTable(tb)
	}
	for _, s := range fixedSets(tb) {
		t.b.sets[s.Name] = s
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	for _, cs := range baseChains {
		t.addBaseChain(cs)
	}
	for _, name := range regularChains {
		c.AddChain(&nftables.Chain{Name: name, Table: tb})
	}
	rules := fixedRules(t.b.cfg)
	for _, cs := range baseChains {
		t.addRules(cs.name, rules[cs.name])
	}
	for _, name := range regularChains {
		t.addRules(name, rules[name])
	}
	t.stats.Messages += 3 + len(t.b.sets) + len(baseChains) + len(regularChains)
	return nil
}

func (t *tx) addBaseChain(cs chainSpec) {
	prio := nftables.ChainPriority(cs.priority)
	policy := nftables.ChainPolicyAccept
	t.conn.AddChain(&nftables.Chain{Name: cs.name, Table: t.b.table, Type: cs.typ, Hooknum: cs.hook, Priority: &prio, Policy: &policy})
}

// reconcileFixed brings the fixed chains and sets of a table the kernel
// holds in line: missing ones are created, fixed chains whose rules differ
// (another configuration) are rewritten, and everything else is left as
// it is.
func (t *tx) reconcileFixed() error {
	k, tb := t.kernel, t.b.table
	for _, s := range fixedSets(tb) {
		t.b.sets[s.Name] = s
		if k.sets[s.Name] == nil {
			if err := t.conn.AddSet(s, nil); err != nil {
				return fmt.Errorf("set %s: %w", s.Name, err)
			}
			t.stats.Messages++
		}
	}
	for _, cs := range baseChains {
		if !k.chains[cs.name] {
			t.addBaseChain(cs)
			t.stats.Messages++
		}
	}
	for _, name := range regularChains {
		if !k.chains[name] {
			t.conn.AddChain(&nftables.Chain{Name: name, Table: tb})
			t.stats.Messages++
		}
	}
	rules := fixedRules(t.b.cfg)
	names := []string{}
	for _, cs := range baseChains {
		names = append(names, cs.name)
	}
	for _, name := range append(names, regularChains...) {
		want := rules[name]
		if k.rules[name] == len(want) && (len(want) == 0 || bytes.Equal(k.tags[name], t.b.fixedTag(name))) {
			continue
		}
		if k.rules[name] > 0 {
			t.conn.FlushChain(&nftables.Chain{Name: name, Table: tb})
			t.stats.Messages++
		}
		t.addRules(name, want)
	}
	return nil
}

func (t *tx) addRules(chain string, rules [][]expr.Any) {
	ch := &nftables.Chain{Name: chain, Table: t.b.table}
	tag := t.b.fixedTag(chain)
	for _, r := range rules {
		t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, Exprs: r, UserData: tag})
		t.stats.Messages++
	}
}

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
				add(cat(matchPrefix(f, false, p, expr.CmpOpEq), []expr.Any{verdict(expr.VerdictGoto, body.shortCircuit)}))
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
				&expr.Immediate{Register: reg1, Data: epKeyID(id)},
				&expr.Numgen{Register: reg32After(4), Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setEndpoints(f, id)},
				dnatFrom(f, reg1)})
		}
		for i, ep := range body.slots() {
			t.addEndpoint(f, id, i, ep)
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
			if err := t.conn.AddSet(r.anon, r.anonElems); err != nil {
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
		rules = append(rules, pendingRule{exprs: []expr.Any{loadAddr(f, false, reg1), lookup(setName, false), verdict(expr.VerdictGoto, chain)}})
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
		if err := t.conn.AddSet(set, nil); err != nil {
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
	t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, UserData: tag, Exprs: []expr.Any{
		loadAddr(f, false, reg1),
		&expr.Dynset{SrcRegKey: reg1, SetName: setName, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: d},
		counter(),
		&expr.Immediate{Register: reg1, Data: addrBytes(ep.Addr())},
		&expr.Immediate{Register: reg32After(al), Data: portBytes(ep.Port())},
		dnatFrom(f, reg1),
	}})
	t.stats.Messages += 2
}

func (t *tx) addEndpoint(f portal.Family, id uint32, i int, ep netip.AddrPort) {
	s := setEndpoints(f, id)
	t.addElems[s] = append(t.addElems[s], nftables.SetElement{Key: epKey(id, i), Val: addrPortVal(ep)})
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
		t.addEndpoint(body.family, id, i, ep)
	}
}

func (t *tx) setElems(m map[string][]nftables.SetElement, add bool) error {
	names := make([]string, 0, len(m))
	for s := range m {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, s := range names {
		if err := t.sendElems(t.b.sets[s], m[s], add); err != nil {
			return err
		}
	}
	return nil
}

// sendElems adds or deletes elements of one set, in messages of at most
// elemChunkBytes.
func (t *tx) sendElems(set *nftables.Set, els []nftables.SetElement, add bool) error {
	for len(els) > 0 {
		n, size := 0, 0
		for n < len(els) && size+elemLen(set, &els[n]) <= elemChunkBytes {
			size += elemLen(set, &els[n])
			n++
		}
		n = max(n, 1)
		chunk := els[:n]
		els = els[n:]
		t.stats.Messages++
		if t.sender != nil && t.sender.hold {
			t.sender.appendHeld(elemMessage(set, chunk, add))
			continue
		}
		var err error
		if add {
			err = t.conn.SetAddElements(set, chunk)
		} else {
			err = t.conn.SetDeleteElements(set, chunk)
		}
		if err != nil {
			return fmt.Errorf("set %s: %w", set.Name, err)
		}
	}
	return nil
}

// commit sends the transaction and, when the kernel accepts it, adopts the
// new state in memory.
func (t *tx) commit() (dataplane.SyncStats, error) {
	t.claimWaiting()
	// Shared elements: added or deleted when their count crosses zero.
	for id, d := range t.refD {
		if d == 0 {
			continue
		}
		before := 0
		if !t.full {
			before = t.b.refs[id]
		}
		after := before + d
		set, key, _ := strings.Cut(id, "\x00")
		switch {
		case before <= 0 && after > 0:
			t.addElems[set] = append(t.addElems[set], nftables.SetElement{Key: []byte(key)})
		case before > 0 && after <= 0:
			t.delElems[set] = append(t.delElems[set], nftables.SetElement{Key: []byte(key)})
		}
	}

	if err := t.writeRangeSets(); err != nil {
		return t.stats, err
	}
	sort.Strings(t.newChains)
	for _, name := range t.newChains {
		if t.kernel != nil && t.kernel.chains[name] {
			continue // a full sync in place: emitRules compares its rules
		}
		t.conn.AddChain(&nftables.Chain{Name: name, Table: t.b.table})
		t.stats.Messages++
	}
	names := make([]string, 0, len(t.bodies))
	for name := range t.bodies {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if t.rewrite[name] {
			t.conn.FlushChain(&nftables.Chain{Name: name, Table: t.b.table})
			t.stats.Messages++
			t.dropEndpoints(name, t.oldBodies[name])
		}
		t.chainRules(name, t.bodies[name])
	}
	for _, name := range t.delChains {
		t.dropEndpoints(name, t.oldBodies[name])
		t.b.releaseID(name)
	}
	if t.kernel != nil {
		t.reconcileKernel()
	}
	if t.sender != nil {
		// From here the library's messages are held, so that the
		// elements, encoded by onehop, go between them in order.
		t.sender.hold = true
		if err := t.conn.Flush(); err != nil {
			return t.stats, err
		}
	}
	if err := t.setElems(t.delElems, false); err != nil {
		return t.stats, err
	}
	if err := t.setElems(t.addElems, true); err != nil {
		return t.stats, err
	}
	sort.Strings(t.delChains)
	gone := append(slices.Clone(t.delChains), t.delLeftover...)
	for _, name := range gone {
		t.conn.FlushChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	for _, name := range gone {
		t.conn.DelChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	t.stats.Messages += 2 * len(gone)
	for _, name := range t.delSets {
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: name})
		t.stats.Messages++
	}
	t.deleteRangeSets()
	for _, o := range t.delAff {
		t.conn.DelChain(&nftables.Chain{Name: o[1], Table: t.b.table})
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: o[0]})
		t.stats.Messages += 2
	}
	if t.err != nil {
		return t.stats, t.err
	}

	if t.stats.Messages > 0 {
		err := t.conn.Flush()
		if err == nil && t.sender != nil {
			err = t.sender.sendHeld()
		}
		if err != nil {
			return t.stats, fmt.Errorf("nftables transaction (%d messages): %w", t.stats.Messages, err)
		}
	}
	t.adopt()
	return t.stats, nil
}

// reconcileKernel turns a full sync's "everything" into the difference
// from what the kernel holds: elements already there with the same value
// are not sent again, elements nothing wants are deleted, and so are the
// chains and affinity sets nothing wants any more.
func (t *tx) reconcileKernel() {
	k := t.kernel
	for _, s := range fixedSets(t.b.table) {
		want := t.addElems[s.Name]
		t.fullElems += len(want)
		// Indexes, not copies of the elements: at 100k elements a map
		// of SetElement values was a sixth of a restart's allocations.
		wantAt := make(map[string]int32, len(want))
		for i := range want {
			wantAt[string(want[i].Key)] = int32(i)
		}
		kept, nKept := make([]bool, len(want)), 0
		have := k.elems[s.Name]
		for i := range have {
			if j, ok := wantAt[string(have[i].Key)]; ok && !kept[j] && elemEqual(want[j], have[i]) {
				kept[j] = true
				nKept++
				continue
			}
			// The end flag names an interval set's end element.
			t.delElems[s.Name] = append(t.delElems[s.Name], nftables.SetElement{Key: have[i].Key, IntervalEnd: have[i].IntervalEnd})
		}
		if nKept == 0 {
			continue
		}
		send := make([]nftables.SetElement, 0, len(want)-nKept)
		for i := range want {
			if !kept[i] {
				send = append(send, want[i])
			}
		}
		t.addElems[s.Name] = send
	}
	wanted := map[string]bool{}
	for _, cs := range baseChains {
		wanted[cs.name] = true
	}
	for _, name := range regularChains {
		wanted[name] = true
	}
	for name := range t.bodies {
		wanted[name] = true
	}
	for name, c := range t.rangeSets {
		if !c.del {
			wanted[firewallChain(name)] = true
		}
	}
	for set := range t.newAff {
		wanted[kindAffinityEndpoint+strings.TrimPrefix(set, affinitySetPrefix)] = true
	}
	for name := range k.chains {
		if !wanted[name] {
			t.delLeftover = append(t.delLeftover, name)
		}
	}
	sort.Strings(t.delLeftover)
	for name := range k.sets {
		if _, ok := t.newAff[name]; !ok && t.b.sets[name] == nil && !t.wantsRangeSet(name) {
			t.delSets = append(t.delSets, name)
		}
	}
	sort.Strings(t.delSets)
}

func (t *tx) adopt() {
	b := t.b
	if t.full {
		ids, free, next := b.ids, b.freeIDs, b.nextID
		b.reset()
		// Chain ids were allocated afresh while building this transaction.
		b.ids, b.freeIDs, b.nextID = ids, free, next
		// Nothing was applied before: the maps are taken as they are, or
		// sized, instead of grown entry by entry.
		b.services = make(map[portal.ServiceKey]*appliedService, len(t.services))
		b.owners = make(map[string]portal.PortKey, len(t.owners))
	}
	b.synced = true
	for k, s := range t.services {
		if s == nil {
			delete(b.services, k)
		} else {
			b.services[k] = s
		}
	}
	for id, o := range t.owners {
		if o == nil {
			delete(b.owners, id)
		} else {
			b.owners[id] = *o
		}
	}
	for id, d := range t.refD {
		if n := b.refs[id] + d; n > 0 {
			b.refs[id] = n
		} else {
			delete(b.refs, id)
		}
	}
	if t.npChanged {
		b.npIPs = t.npIPs
	}
	if t.podIPsSet {
		b.podIPs = t.podIPs
	}
	if t.svcCIDRsSet {
		b.svcCIDRs = t.svcCIDRs
	}
	for _, o := range t.delAff {
		delete(b.affSets, o[0])
	}
	for aff, timeout := range t.newAff {
		b.affSets[aff] = timeout
	}
	b.chains += len(t.newChains) - len(t.delChains)
	for _, els := range t.addElems {
		b.elements += len(els)
	}
	for _, els := range t.delElems {
		b.elements -= len(els)
	}
	if t.kernel != nil {
		b.elements = t.fullElems
	}
	t.stats.Rules = b.chains // per-portal chains hold one or two rules each
	t.stats.Elements = b.elements
}
