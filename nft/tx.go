package nft

import (
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

func elemSize(e nftables.SetElement) int {
	n := len(e.Key) + len(e.Val) + len(e.Comment) + 48
	if e.VerdictData != nil {
		n += len(e.VerdictData.Chain) + 24
	}
	return n
}

// tx collects one sync's changes: kernel operations in the order the kernel
// needs them, and the in-memory state to adopt if the kernel accepts them.
type tx struct {
	b    *Backend
	conn *nftables.Conn
	full bool

	services  map[portal.ServiceKey]*appliedService // nil value: deleted
	owners    map[string]*portal.PortKey            // nil value: released
	refD      map[string]int                        // shared element id -> change of its reference count
	npIPs     []netip.Addr
	npChanged bool
	podIPs    []portal.PodExternalIP
	podIPsSet bool

	newChains []string
	bodies    map[string]chainBody
	oldBodies map[string]chainBody // of rewritten and deleted chains
	newAff    map[string]bool      // affinity maps created
	delAff    [][2]string          // affinity sets and chains deleted
	err       error
	rewrite   map[string]bool // existing chains whose rules are replaced
	delChains []string
	addElems  map[string][]nftables.SetElement
	delElems  map[string][]nftables.SetElement

	stats     dataplane.SyncStats
	conflicts int
}

func (b *Backend) newTx(conn *nftables.Conn, full bool) *tx {
	return &tx{
		b: b, conn: conn, full: full,
		services:  map[portal.ServiceKey]*appliedService{},
		owners:    map[string]*portal.PortKey{},
		refD:      map[string]int{},
		bodies:    map[string]chainBody{},
		oldBodies: map[string]chainBody{},
		newAff:    map[string]bool{},
		rewrite:   map[string]bool{},
		addElems:  map[string][]nftables.SetElement{},
		delElems:  map[string][]nftables.SetElement{},
	}
}

func (t *tx) oldService(k portal.ServiceKey) *appliedService {
	if t.full {
		return nil
	}
	return t.b.services[k]
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

// service diffs one Service against what was applied.
func (t *tx) service(k portal.ServiceKey, svc *portal.Service) {
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
	newObjs := map[portal.PortKey]*objects{}
	if svc != nil {
		for _, p := range svc.Portals {
			newObjs[p.Key] = render(p, t.b.cfg)
		}
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
		case ob.sameRules(body) && len(body.endpoints) >= 2 && body.affinity == 0:
			t.updateEndpoints(name, ob, body)
			changed = true
		default:
			t.rewrite[name] = true
			t.oldBodies[name] = ob
			t.bodies[name] = body
			changed = true
		}
	}
	newByID := make(map[string]elem, len(n.elems))
	for _, e := range n.elems {
		newByID[e.id()] = e
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
	oldByID := make(map[string]elem, len(o.elems))
	for _, e := range o.elems {
		oldByID[e.id()] = e
	}
	for _, e := range n.elems {
		oe, had := oldByID[e.id()]
		if had && oe.chain == e.chain {
			continue
		}
		if own, ok := t.owner(e.id()); ok && own != pk {
			t.conflicts++
			t.b.log.Warn("address already used by another service port; skipped",
				"portal", pk.String(), "owner", own.String(), "set", e.set)
			continue
		}
		t.addElems[e.set] = append(t.addElems[e.set], t.element(e, true))
		key := pk
		t.owners[e.id()] = &key
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
		el.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.chain}
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

// writeFixed replaces the whole table atomically: add (so that the delete
// cannot fail), delete, and re-create with the fixed chains and sets.
func (t *tx) writeFixed() error {
	c, tb := t.conn, t.b.table
	c.AddTable(tb)
	c.DelTable(tb)
	c.AddTable(tb)
	for _, s := range fixedSets(tb) {
		t.b.sets[s.Name] = s
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	for _, cs := range baseChains {
		prio := nftables.ChainPriority(cs.priority)
		policy := nftables.ChainPolicyAccept
		c.AddChain(&nftables.Chain{Name: cs.name, Table: tb, Type: cs.typ, Hooknum: cs.hook, Priority: &prio, Policy: &policy})
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

func (t *tx) addRules(chain string, rules [][]expr.Any) {
	ch := &nftables.Chain{Name: chain, Table: t.b.table}
	for _, r := range rules {
		t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, Exprs: r})
		t.stats.Messages++
	}
}

// chainRules writes the rules of a per-portal chain, and its endpoints
// into the family's endpoint maps.
func (t *tx) chainRules(name string, body chainBody) {
	ch := &nftables.Chain{Name: name, Table: t.b.table}
	tb := t.b.table
	add := func(e []expr.Any) {
		t.conn.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: e})
		t.stats.Messages++
	}
	f := body.family
	markBits := t.b.cfg.MasqueradeMark()
	if len(body.sourceRanges) > 0 {
		for _, p := range body.sourceRanges {
			add(cat(matchPrefix(f, false, p, expr.CmpOpEq), []expr.Any{verdict(expr.VerdictGoto, body.gotoChain)}))
		}
		add([]expr.Any{counter(), verdict(expr.VerdictDrop, "")})
		return
	}
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
	case n == 1:
		ep := body.endpoints[0]
		al := addrLen(f)
		add([]expr.Any{counter(),
			&expr.Immediate{Register: reg1, Data: addrBytes(ep.Addr())},
			&expr.Immediate{Register: reg32After(al), Data: portBytes(ep.Port())},
			dnatFrom(f, reg1)})
	default:
		if body.affinity > 0 {
			if err := t.affinityRules(add, name, body); err != nil {
				t.err = err
			}
			return
		}
		// dnat to id . numgen random mod N map @endpoints<f>-<shard>
		id := t.b.chainID(name)
		add([]expr.Any{counter(),
			&expr.Immediate{Register: reg1, Data: epKeyID(id)},
			&expr.Numgen{Register: reg32After(4), Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: setEndpoints(f, id)},
			dnatFrom(f, reg1)})
		for i, ep := range body.endpoints {
			t.addEndpoint(f, id, i, ep)
		}
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
func (t *tx) affinityRules(add func([]expr.Any), name string, body chainBody) error {
	f := body.family
	timeout := time.Duration(body.affinity) * time.Second
	objs := body.affinityObjects(name)
	vm := &nftables.Set{Table: t.b.table, Anonymous: true, Constant: true, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	var vmElems []nftables.SetElement
	for i, ep := range body.endpoints {
		setName, chain := objs[ep][0], objs[ep][1]
		if !t.b.affSets[setName] && !t.newAff[setName] {
			set := &nftables.Set{Table: t.b.table, Name: setName, HasTimeout: true, Dynamic: true, Timeout: timeout, KeyType: addrType(f)}
			if err := t.conn.AddSet(set, nil); err != nil {
				return err
			}
			ch := &nftables.Chain{Name: chain, Table: t.b.table}
			t.conn.AddChain(ch)
			al := addrLen(f)
			t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, Exprs: []expr.Any{
				loadAddr(f, false, reg1),
				&expr.Dynset{SrcRegKey: reg1, SetName: setName, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout},
				counter(),
				&expr.Immediate{Register: reg1, Data: addrBytes(ep.Addr())},
				&expr.Immediate{Register: reg32After(al), Data: portBytes(ep.Port())},
				dnatFrom(f, reg1),
			}})
			t.newAff[setName] = true
			t.stats.Messages += 3
		}
		add([]expr.Any{loadAddr(f, false, reg1), lookup(setName, false), verdict(expr.VerdictGoto, chain)})
		vmElems = append(vmElems, nftables.SetElement{Key: numgenKey(uint32(i)), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}})
	}
	if err := t.conn.AddSet(vm, vmElems); err != nil {
		return err
	}
	t.stats.Messages += 2
	add([]expr.Any{
		&expr.Numgen{Register: reg1, Modulus: uint32(len(body.endpoints)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, IsDestRegSet: true, SetName: vm.Name, SetID: vm.ID},
	})
	return nil
}

func (t *tx) addEndpoint(f portal.Family, id uint32, i int, ep netip.AddrPort) {
	s := setEndpoints(f, id)
	t.addElems[s] = append(t.addElems[s], nftables.SetElement{Key: epKey(id, i), Val: addrPortVal(ep)})
}

func (t *tx) delEndpoint(f portal.Family, id uint32, i int) {
	s := setEndpoints(f, id)
	t.delElems[s] = append(t.delElems[s], nftables.SetElement{Key: epKey(id, i)})
}

// dropEndpoints deletes the endpoint-map elements of a chain's old body,
// and its affinity map when the new body has another or none.
func (t *tx) dropEndpoints(name string, old, next chainBody) {
	keep := next.affinityObjects(name)
	for ep, o := range old.affinityObjects(name) {
		if keep[ep] != o {
			t.delAff = append(t.delAff, o) // set, chain
		}
	}
	if old.affinity > 0 {
		return // no endpoint-map elements
	}
	if len(old.endpoints) < 2 {
		return
	}
	id := t.b.chainID(name)
	for i := range old.endpoints {
		t.delEndpoint(old.family, id, i)
	}
}

// updateEndpoints replaces the endpoint-map elements that differ: the
// most common change (a pod replaced) touches no rule.
func (t *tx) updateEndpoints(name string, old, body chainBody) {
	id := t.b.chainID(name)
	for i, ep := range body.endpoints {
		if old.endpoints[i] == ep {
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
		els := m[s]
		for len(els) > 0 {
			n, size := 0, 0
			for n < len(els) && size+elemSize(els[n]) <= elemChunkBytes {
				size += elemSize(els[n])
				n++
			}
			n = max(n, 1)
			chunk := els[:n]
			els = els[n:]
			var err error
			if add {
				err = t.conn.SetAddElements(t.b.sets[s], chunk)
			} else {
				err = t.conn.SetDeleteElements(t.b.sets[s], chunk)
			}
			if err != nil {
				return fmt.Errorf("set %s: %w", s, err)
			}
			t.stats.Messages++
		}
	}
	return nil
}

// commit sends the transaction and, when the kernel accepts it, adopts the
// new state in memory.
func (t *tx) commit() (dataplane.SyncStats, error) {
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

	sort.Strings(t.newChains)
	for _, name := range t.newChains {
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
			t.dropEndpoints(name, t.oldBodies[name], t.bodies[name])
		}
		t.chainRules(name, t.bodies[name])
	}
	for _, name := range t.delChains {
		t.dropEndpoints(name, t.oldBodies[name], chainBody{})
		t.b.releaseID(name)
	}
	if err := t.setElems(t.delElems, false); err != nil {
		return t.stats, err
	}
	if err := t.setElems(t.addElems, true); err != nil {
		return t.stats, err
	}
	sort.Strings(t.delChains)
	for _, name := range t.delChains {
		t.conn.FlushChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	for _, name := range t.delChains {
		t.conn.DelChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	t.stats.Messages += 2 * len(t.delChains)
	for _, o := range t.delAff {
		t.conn.DelChain(&nftables.Chain{Name: o[1], Table: t.b.table})
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: o[0]})
		t.stats.Messages += 2
	}
	if t.err != nil {
		return t.stats, t.err
	}

	if t.stats.Messages > 0 {
		if err := t.conn.Flush(); err != nil {
			return t.stats, fmt.Errorf("nftables transaction (%d messages): %w", t.stats.Messages, err)
		}
	}
	t.adopt()
	return t.stats, nil
}

func (t *tx) adopt() {
	b := t.b
	if t.full {
		ids, free, next := b.ids, b.freeIDs, b.nextID
		b.reset()
		// Chain ids were allocated afresh while building this transaction.
		b.ids, b.freeIDs, b.nextID = ids, free, next
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
	for _, o := range t.delAff {
		delete(b.affSets, o[0])
	}
	for aff := range t.newAff {
		b.affSets[aff] = true
	}
	b.chains += len(t.newChains) - len(t.delChains)
	for _, els := range t.addElems {
		b.elements += len(els)
	}
	for _, els := range t.delElems {
		b.elements -= len(els)
	}
	t.stats.Rules = b.chains // per-portal chains hold one or two rules each
	t.stats.Elements = b.elements
}
