package ipvs

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// targetPort is where the pods' echo servers listen.
func targetPort(p portal.Protocol) uint16 {
	if p == portal.UDP {
		return 5353
	}
	return 8080
}

func churnEPAddr(f portal.Family, pod int) netip.Addr {
	if f == portal.IPv4 {
		return netip.MustParseAddr(podIP(pod))
	}
	return netip.MustParseAddr(podIP6(pod))
}

// endpoints are the ready endpoints (only local ones with local), or the
// serving terminating ones when none is ready, as portal picks them.
func (s *churnSvc) endpoints(f portal.Family, proto portal.Protocol, local bool) []netip.AddrPort {
	var ready, serving []netip.AddrPort
	for _, e := range s.eps {
		if local && !e.local {
			continue
		}
		a := netip.AddrPortFrom(churnEPAddr(f, e.pod), targetPort(proto))
		switch {
		case e.ready:
			ready = append(ready, a)
		case e.serving:
			serving = append(serving, a)
		}
	}
	if len(ready) == 0 {
		ready = serving
	}
	slices.SortFunc(ready, netip.AddrPort.Compare)
	return ready
}

func ofFamily[T interface{ Addr() netip.Addr }](xs []T, f portal.Family) []T {
	var out []T
	for _, x := range xs {
		if portal.FamilyOf(x.Addr()) == f {
			out = append(out, x)
		}
	}
	return out
}

func addrsOf(as []netip.Addr, f portal.Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if portal.FamilyOf(a) == f {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// portals is the model Service as portal.Build presents it.
func (s *churnSvc) portals() *portal.Service {
	out := &portal.Service{Key: s.key}
	for _, f := range s.families {
		for _, sp := range s.ports {
			p := &portal.Portal{
				Key:              portal.PortKey{Service: s.key, Port: sp.name, Protocol: sp.proto, Family: f},
				Port:             sp.port,
				ClusterIPs:       []netip.Addr{s.clusterIP[f]},
				NodePort:         sp.nodePort,
				ExternalIPs:      addrsOf(s.extIPs, f),
				InternalLocal:    s.intLocal,
				Affinity:         portal.Affinity{TimeoutSeconds: s.affinity},
				Scheduler:        s.sched,
				ClusterEndpoints: s.endpoints(f, sp.proto, false),
				LocalEndpoints:   s.endpoints(f, sp.proto, true),
			}
			if s.lb {
				p.LoadBalancerIPs = addrsOf(s.lbIPs, f)
				p.SourceRanges = ofFamily(s.ranges, f)
			}
			p.ExternalLocal = s.extLocal && p.HasExternal()
			out.Portals = append(out.Portals, p)
		}
	}
	return out
}

func (m *churnModel) snapshot() *portal.Snapshot {
	m.rng.Shuffle(len(m.dirty), func(i, j int) { m.dirty[i], m.dirty[j] = m.dirty[j], m.dirty[i] })
	for _, k := range m.dirty {
		if s, ok := m.svcs[k]; ok {
			m.built[k] = s.portals()
		} else {
			delete(m.built, k)
		}
	}
	snap := &portal.Snapshot{Node: portal.Node{Name: "node", NodePortAddrs: slices.Clone(m.npAddrs)},
		Services: make(map[portal.ServiceKey]*portal.Service, len(m.built)), Dirty: m.dirty}
	slices.SortFunc(snap.Node.NodePortAddrs, netip.Addr.Compare)
	for k, s := range m.built {
		snap.Services[k] = s
	}
	m.dirty = nil
	return snap
}

// way is one way into a model portal: a virtual server and what it must
// hold.
type way struct {
	key      vsKey
	svc      *churnSvc
	external bool // reached from outside: external, LB IP or NodePort
	lb       bool // load-balancer IP (source ranges apply)
	nodePort bool
	eps      []netip.AddrPort
}

// ways lists every way into every portal of the model.
func (m *churnModel) ways() []way {
	var out []way
	for _, s := range m.svcs {
		for _, f := range s.families {
			for _, p := range s.ports {
				internal := s.endpoints(f, p.proto, s.intLocal)
				hasExt := len(addrsOf(s.extIPs, f)) > 0 || p.nodePort != 0 || (s.lb && len(addrsOf(s.lbIPs, f)) > 0)
				external := s.endpoints(f, p.proto, s.extLocal && hasExt)
				out = append(out, way{key: vsKey{p.proto, s.clusterIP[f], p.port}, svc: s, eps: internal})
				for _, a := range addrsOf(s.extIPs, f) {
					out = append(out, way{key: vsKey{p.proto, a, p.port}, svc: s, external: true, eps: external})
				}
				if s.lb {
					for _, a := range addrsOf(s.lbIPs, f) {
						out = append(out, way{key: vsKey{p.proto, a, p.port}, svc: s, external: true, lb: true, eps: external})
					}
				}
				if p.nodePort != 0 {
					for _, a := range addrsOf(m.npAddrs, f) {
						out = append(out, way{key: vsKey{p.proto, a, p.nodePort}, svc: s, external: true, nodePort: true, eps: external})
					}
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b way) int { return strings.Compare(a.key.String(), b.key.String()) })
	return out
}
