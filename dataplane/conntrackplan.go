package dataplane

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

// ctChange is one Service to remember (svc) or forget (svc nil) once the
// cleanup succeeded.
type ctChange struct {
	key portal.ServiceKey
	svc *portal.Service
}

// planConntrack compares the remembered Services with the whole of snap
// and returns the filter of stale entries and the changes to the
// remembered Services.
func planConntrack(prev map[portal.ServiceKey]*portal.Service, snap *portal.Snapshot) (*conntrackFilter, []ctChange) {
	pending := map[portal.ServiceKey][]*portal.Service{}
	one := make([]*portal.Service, 0, len(snap.Services)+len(prev)) // one version each
	add := func(k portal.ServiceKey, svc *portal.Service) {
		one = append(one, svc)
		pending[k] = one[len(one)-1 : len(one) : len(one)]
	}
	for k, svc := range snap.Services {
		add(k, svc)
	}
	for k := range prev {
		if _, ok := snap.Services[k]; !ok {
			add(k, nil)
		}
	}
	sctp := func(yield func(*portal.Service) bool) {
		for _, svc := range snap.Services {
			if hasSCTP(svc) && !yield(svc) {
				return
			}
		}
	}
	return planChanges(prev, pending, snap.Node.NodePortAddrs, sctp)
}

// planChanges returns the filter of the entries that the pending changes
// (Service -> the versions applied since prev, oldest first, nil when
// deleted; the last is the current one) make stale, and the changes to the
// remembered Services. Services are compared by pointer: the producer
// builds a new *Service when one changes. sctp yields the latest Services
// that have SCTP ports.
func planChanges(prev map[portal.ServiceKey]*portal.Service, pending map[portal.ServiceKey][]*portal.Service, nodeAddrs []netip.Addr, sctp iter.Seq[*portal.Service]) (*conntrackFilter, []ctChange) {
	f := &conntrackFilter{vips: map[ctVIP]*ctTarget{}, nodePorts: map[ctNodePort]*ctTarget{}}
	for _, a := range nodeAddrs {
		if f.nodeAddrs == nil {
			f.nodeAddrs = map[netip.Addr]struct{}{}
		}
		f.nodeAddrs[a.Unmap()] = struct{}{}
	}
	var changes []ctChange
	for k, versions := range pending {
		if len(versions) == 0 {
			continue
		}
		cur := versions[len(versions)-1]
		// Flows may have begun through the remembered version and
		// through every one applied since, up to the current one.
		var olds []*portal.Service
		for _, v := range append([]*portal.Service{prev[k]}, versions[:len(versions)-1]...) {
			if v != cur {
				olds = append(olds, v)
			}
		}
		if len(olds) == 0 {
			continue
		}
		f.addChange(olds, cur)
		changes = append(changes, ctChange{k, cur})
	}
	f.scopeSCTP(sctp)
	return f, changes
}

// portalsByKey indexes svc's portals.
func portalsByKey(svc *portal.Service) map[portal.PortKey]*portal.Portal {
	out := map[portal.PortKey]*portal.Portal{}
	if svc == nil {
		return out
	}
	for _, p := range svc.Portals {
		out[p.Key] = p
	}
	return out
}

// balanced reports whether p DNATs to any endpoint (cluster or local): if
// not, its flows were recorded un-NATed.
func balanced(p *portal.Portal) bool {
	return p != nil && len(p.ClusterEndpoints)+len(p.LocalEndpoints) > 0
}

// servingSet is every endpoint a flow DNATed through p may stay on: the
// serving ones, and the DNAT targets, which are among them (a Portal not
// built from Kubernetes objects may leave Serving out). For SCTP only the
// addresses count (port 0).
func servingSet(p *portal.Portal) map[netip.AddrPort]struct{} {
	out := map[netip.AddrPort]struct{}{}
	if p == nil {
		return out
	}
	sctp := p.Key.Protocol == portal.SCTP
	for _, list := range [][]netip.AddrPort{p.Serving, p.ClusterEndpoints, p.LocalEndpoints} {
		for _, ep := range list {
			if sctp {
				ep = netip.AddrPortFrom(ep.Addr(), 0)
			}
			out[netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())] = struct{}{}
		}
	}
	return out
}

// vipsOf lists p's addresses (cluster, external, load-balancer) as
// original destinations.
func vipsOf(p *portal.Portal) []ctVIP {
	if p == nil {
		return nil
	}
	port := p.Port
	if p.Key.Protocol == portal.SCTP {
		port = 0
	}
	var out []ctVIP
	for _, list := range [][]netip.Addr{p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs} {
		for _, a := range list {
			out = append(out, ctVIP{uint8(p.Key.Protocol), a.Unmap(), port})
		}
	}
	return out
}

// addChange adds the destinations of the Service ports that changed from
// the versions olds (any may be nil: the Service did not exist) to cur
// (nil: deleted) in a way that leaves stale entries.
func (f *conntrackFilter) addChange(olds []*portal.Service, cur *portal.Service) {
	byVersion := make([]map[portal.PortKey]*portal.Portal, len(olds))
	curs := portalsByKey(cur)
	keys := map[portal.PortKey]struct{}{}
	for i, o := range olds {
		byVersion[i] = portalsByKey(o)
		for key := range byVersion[i] {
			keys[key] = struct{}{}
		}
	}
	for key := range curs {
		keys[key] = struct{}{}
	}
	ports := make([]*portal.Portal, len(olds))
	for key := range keys {
		for i, m := range byVersion {
			ports[i] = m[key] // nil where the version lacks the port
		}
		f.addPort(ports, curs[key])
	}
}

// addPort adds one Service port's destinations when its change from the
// versions olds (nil: the port did not exist) to c (nil: removed) can leave
// stale entries: a serving endpoint of some version that c does not have
// serving (flows DNATed to it), DNAT targets in c after a version without
// (flows recorded un-NATed while none was a target), an address or
// NodePort of some version that c lacks.
func (f *conntrackFilter) addPort(olds []*portal.Portal, c *portal.Portal) {
	curEPs := servingSet(c)
	curVIPs := map[ctVIP]bool{}
	for _, v := range vipsOf(c) {
		curVIPs[v] = true
	}
	var curNP uint16
	either := c
	if c != nil {
		curNP = c.NodePort
	}
	var (
		lost, unserved bool
		goneVIPs       []ctVIP
		goneNPs        []uint16
	)
	for _, o := range olds {
		unserved = unserved || !balanced(o) // includes created and re-created
		for ep := range servingSet(o) {
			if _, ok := curEPs[ep]; !ok {
				lost = true
				break
			}
		}
		for _, v := range vipsOf(o) {
			if !curVIPs[v] && !slices.Contains(goneVIPs, v) {
				goneVIPs = append(goneVIPs, v)
			}
		}
		if o == nil {
			continue
		}
		if either == nil {
			either = o
		}
		if o.NodePort != 0 && o.NodePort != curNP && !slices.Contains(goneNPs, o.NodePort) {
			goneNPs = append(goneNPs, o.NodePort)
		}
	}
	became := balanced(c) && unserved
	if either == nil || (!lost && !became && len(goneVIPs) == 0 && len(goneNPs) == 0) {
		return
	}
	f.ports++
	family := either.Key.Family // every version shares the PortKey
	if family == portal.IPv6 {
		f.v6 = true
	} else {
		f.v4 = true
	}
	cur := &ctTarget{endpoints: curEPs, balanced: balanced(c)}
	gone := &ctTarget{endpoints: map[netip.AddrPort]struct{}{}}
	for v := range curVIPs {
		f.addVIP(v, cur)
	}
	for _, v := range goneVIPs {
		f.addVIP(v, gone)
	}
	if either.Key.Protocol == portal.SCTP {
		return // SCTP NodePorts: ports are not decoded
	}
	proto := uint8(either.Key.Protocol)
	if curNP != 0 {
		f.nodePorts[ctNodePort{proto, family, curNP}] = cur
	}
	for _, np := range goneNPs {
		if _, still := f.nodePorts[ctNodePort{proto, family, np}]; !still {
			f.nodePorts[ctNodePort{proto, family, np}] = gone
		}
	}
}

// addVIP records t for v; a destination already recorded keeps its current
// state (an address that moved between Services counts for its new one).
func (f *conntrackFilter) addVIP(v ctVIP, t *ctTarget) {
	if have, ok := f.vips[v]; ok && (have.balanced || len(have.endpoints) > 0) {
		return
	}
	f.vips[v] = t
}

// scopeSCTP widens each SCTP destination to the endpoints of every SCTP
// port on that address: without ports, a flow to another SCTP port of the
// same address must not look stale.
func (f *conntrackFilter) scopeSCTP(sctp iter.Seq[*portal.Service]) {
	need := map[netip.Addr]*ctTarget{}
	for v, t := range f.vips {
		if v.proto == uint8(portal.SCTP) {
			need[v.addr] = t
		}
	}
	if len(need) == 0 {
		return
	}
	for svc := range sctp {
		for _, p := range svc.Portals {
			if p.Key.Protocol != portal.SCTP {
				continue
			}
			for _, v := range vipsOf(p) {
				t, ok := need[v.addr]
				if !ok {
					continue
				}
				eps := servingSet(p)
				if len(eps) > 0 {
					merged := &ctTarget{endpoints: map[netip.AddrPort]struct{}{}, balanced: t.balanced}
					for ep := range t.endpoints {
						merged.endpoints[ep] = struct{}{}
					}
					for ep := range eps {
						merged.endpoints[ep] = struct{}{}
					}
					need[v.addr] = merged
					f.vips[ctVIP{uint8(portal.SCTP), v.addr, 0}] = merged
				}
			}
		}
	}
}
