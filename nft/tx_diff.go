package nft

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/portal"
)

// This file diffs what a sync wants against what was applied: a Service's
// portals, element by element and chain by chain, and the node's own
// addresses (node ports, pod external IPs).

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
		newByID = elemsByID(n.elems)
	}
	var released []string
	for _, e := range o.elems {
		if ne, ok := newByID[e.id()]; ok && ne.sameValue(e) {
			if e.eps != nil && !slices.Equal(e.eps, ne.eps) {
				if own, ok := t.owner(e.ownerID()); ok && own == pk {
					t.flatUpdate(e, ne)
					changed = true
				}
			}
			continue
		}
		if own, ok := t.owner(e.ownerID()); ok && own == pk {
			t.delElems[e.set] = append(t.delElems[e.set], t.element(e, false))
			if e.eps != nil {
				t.flatDel(e)
			}
			released = append(released, e.ownerID())
			changed = true
		}
	}
	// After the loop: an element that stands for another may share its
	// owner with the element that replaces it.
	for _, id := range released {
		t.owners[id] = nil
	}
	var oldByID map[string]elem
	if len(o.elems) > 0 {
		oldByID = elemsByID(o.elems)
	}
	owner := &pk // one for all the elements this portal takes
	for _, e := range n.elems {
		oe, had := oldByID[e.id()]
		if had && oe.sameValue(e) {
			continue
		}
		if _, ok := t.otherOwner(pk, e); ok {
			// The owner may let it go later in this sync (an address
			// handed from one Service to another): decided at commit.
			t.waiting = append(t.waiting, waitingElem{pk, e})
			continue
		}
		t.addElems[e.set] = append(t.addElems[e.set], t.element(e, true))
		if e.eps != nil {
			t.flatAdd(e)
		}
		t.owners[e.ownerID()] = owner
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

// elemsByID indexes a portal's elements by their id.
func elemsByID(elems []elem) map[string]elem {
	m := make(map[string]elem, len(elems))
	for _, e := range elems {
		m[e.id()] = e
	}
	return m
}
