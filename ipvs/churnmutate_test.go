package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

func (m *churnModel) create() {
	m.next++
	m.createAs(portal.ServiceKey{Namespace: "churn", Name: fmt.Sprintf("s%d", m.next)})
}

func (m *churnModel) createAs(k portal.ServiceKey) {
	if len(m.svcs) >= churnMaxServices {
		return
	}
	s := &churnSvc{key: k, clusterIP: map[portal.Family]netip.Addr{}}
	if !m.setFamilies(s, m.families()) {
		return
	}
	m.svcs[k] = s
	m.addPort(s)
	for range m.rng.IntN(3) {
		m.addEP(s)
	}
	if m.rng.IntN(3) == 0 {
		m.setNodePorts(s, true)
	}
	m.touch(k)
	m.logf("create %v %v", k, s.families)
}

func (m *churnModel) delete(s *churnSvc) {
	for _, a := range s.clusterIP {
		delete(m.owner, a)
	}
	for _, a := range append(slices.Clone(s.extIPs), s.lbIPs...) {
		delete(m.owner, a)
	}
	for _, p := range s.ports {
		delete(m.ports, p.nodePort)
	}
	delete(m.svcs, s.key)
	m.touch(s.key)
}

// setFamilies changes the families, giving a cluster IP to a new one and
// dropping the addresses of an old one; false when no address was free.
func (m *churnModel) setFamilies(s *churnSvc, fams []portal.Family) bool {
	taken := map[portal.Family]netip.Addr{}
	for _, f := range fams {
		if a, ok := s.clusterIP[f]; ok {
			taken[f] = a
		} else if a, ok := m.take(s.key, f, 96, 4000); ok {
			taken[f] = a
		} else {
			for f, a := range taken {
				if s.clusterIP[f] != a {
					delete(m.owner, a)
				}
			}
			return false
		}
	}
	for f, a := range s.clusterIP {
		if _, ok := taken[f]; !ok {
			delete(m.owner, a)
		}
	}
	keep := func(as []netip.Addr) []netip.Addr {
		return slices.DeleteFunc(as, func(a netip.Addr) bool {
			if _, ok := taken[portal.FamilyOf(a)]; !ok {
				delete(m.owner, a)
				return true
			}
			return false
		})
	}
	s.extIPs, s.lbIPs = keep(s.extIPs), keep(s.lbIPs)
	s.clusterIP, s.families = taken, fams
	return true
}

func (m *churnModel) setNodePorts(s *churnSvc, on bool) {
	for i := range s.ports {
		switch {
		case on && s.ports[i].nodePort == 0:
			s.ports[i].nodePort = m.nodePort()
		case !on && s.ports[i].nodePort != 0:
			delete(m.ports, s.ports[i].nodePort)
			s.ports[i].nodePort = 0
		}
	}
}

func (s *churnSvc) hasNodePorts() bool { return len(s.ports) > 0 && s.ports[0].nodePort != 0 }

func (m *churnModel) addPort(s *churnSvc) {
	proto, port := portal.TCP, uint16(80+m.rng.IntN(4))
	if m.rng.IntN(3) == 0 {
		proto, port = portal.UDP, uint16(53+m.rng.IntN(2))
	}
	for _, p := range s.ports {
		if p.proto == proto && p.port == port {
			return
		}
	}
	p := churnPort{name: fmt.Sprintf("p%d-%s", port, proto), proto: proto, port: port}
	if s.hasNodePorts() {
		p.nodePort = m.nodePort()
	}
	s.ports = append(s.ports, p)
}

func (m *churnModel) addEP(s *churnSvc) {
	e := churnEP{pod: 1 + m.rng.IntN(churnPods), ready: m.rng.IntN(5) != 0, serving: m.rng.IntN(2) == 0, local: m.rng.IntN(2) == 0}
	if slices.ContainsFunc(s.eps, func(x churnEP) bool { return x.pod == e.pod }) {
		return
	}
	s.eps = append(s.eps, e)
}

// mutate applies one random valid mutation.
func (m *churnModel) mutate() {
	s := m.pick()
	if s == nil || m.rng.IntN(15) == 0 {
		m.create()
		return
	}
	k := s.key
	m.touch(k)
	switch m.rng.IntN(22) {
	case 0:
		m.delete(s)
		m.logf("delete %v", k)
	case 1:
		// Deleted and created again under the same name in one batch.
		m.delete(s)
		m.logf("delete %v (to create it again)", k)
		m.createAs(k)
	case 2:
		on := !s.hasNodePorts()
		m.setNodePorts(s, on)
		if !on {
			s.lb = false
		}
		m.logf("%v: NodePorts %v", k, on)
	case 3:
		s.lb = !s.lb
		if s.lb {
			m.setNodePorts(s, true)
		} else {
			for _, a := range s.lbIPs {
				delete(m.owner, a)
			}
			s.lbIPs, s.ranges = nil, nil
		}
		m.logf("%v: LoadBalancer %v", k, s.lb)
	case 4:
		m.addPort(s)
		m.logf("%v: add a port (%d)", k, len(s.ports))
	case 5:
		if len(s.ports) > 1 {
			i := m.rng.IntN(len(s.ports))
			delete(m.ports, s.ports[i].nodePort)
			m.logf("%v: remove port %s", k, s.ports[i].name)
			s.ports = slices.Delete(s.ports, i, i+1)
		}
	case 6:
		if fams := m.families(); m.setFamilies(s, fams) {
			m.logf("%v: families %v", k, fams)
		}
	case 7:
		s.extLocal = !s.extLocal
		m.logf("%v: externalTrafficPolicy Local=%v", k, s.extLocal)
	case 8:
		s.intLocal = !s.intLocal
		m.logf("%v: internalTrafficPolicy Local=%v", k, s.intLocal)
	case 9:
		switch {
		case s.affinity == 0:
			s.affinity = 10800
		case m.rng.IntN(2) == 0:
			s.affinity = 0
		default:
			s.affinity = uint32(60 + m.rng.IntN(3600))
		}
		m.logf("%v: affinity %d", k, s.affinity)
	case 10:
		s.sched = churnScheds[m.rng.IntN(len(churnScheds))]
		m.logf("%v: scheduler %q", k, s.sched)
	case 11:
		s.ranges = nil
		for _, r := range churnRanges {
			if m.rng.IntN(3) == 0 {
				s.ranges = append(s.ranges, r)
			}
		}
		m.logf("%v: source ranges %v", k, s.ranges)
	case 12, 13:
		m.addEP(s)
		m.logf("%v: add an endpoint (%d)", k, len(s.eps))
	case 14:
		if len(s.eps) > 0 {
			i := m.rng.IntN(len(s.eps))
			m.logf("%v: remove endpoint pod-%d", k, s.eps[i].pod)
			s.eps = slices.Delete(s.eps, i, i+1)
		}
	case 15, 16:
		if len(s.eps) > 0 {
			e := &s.eps[m.rng.IntN(len(s.eps))]
			e.ready, e.serving = !e.ready, m.rng.IntN(2) == 0
			if m.rng.IntN(3) == 0 {
				e.local = !e.local
			}
			m.logf("%v: pod-%d ready=%v serving=%v local=%v", k, e.pod, e.ready, e.serving, e.local)
		}
	case 17:
		m.toggleAddr(s, &s.extIPs, 97, "external IP")
	case 18:
		if s.lb {
			m.toggleAddr(s, &s.lbIPs, 98, "LB IP")
		}
	case 19, 20:
		m.handOver(s)
	case 21:
		a := churnNodeAddrs[m.rng.IntN(len(churnNodeAddrs))]
		// Never none: without NodePortAddrs the backend serves NodePorts
		// on every address of the node.
		if i := slices.Index(m.npAddrs, a); i >= 0 {
			if len(m.npAddrs) > 1 {
				m.npAddrs = slices.Delete(slices.Clone(m.npAddrs), i, i+1)
				m.logf("node address %v gone", a)
			}
		} else {
			m.npAddrs = append(slices.Clone(m.npAddrs), a)
			m.logf("node address %v added", a)
		}
	}
}

// toggleAddr drops the first of as, or adds one from pool (up to two).
func (m *churnModel) toggleAddr(s *churnSvc, as *[]netip.Addr, pool byte, what string) {
	if len(*as) > 0 && m.rng.IntN(2) == 0 {
		delete(m.owner, (*as)[0])
		m.logf("%v: drop %s %v", s.key, what, (*as)[0])
		*as = (*as)[1:]
	} else if len(*as) < 2 {
		if a, ok := m.take(s.key, s.families[m.rng.IntN(len(s.families))], pool, 8); ok {
			*as = append(*as, a)
			m.logf("%v: add %s %v", s.key, what, a)
		}
	}
}

// handOver moves an external or load-balancer IP from s to another Service
// in the same batch.
func (m *churnModel) handOver(s *churnSvc) {
	to := m.pick()
	if to == s {
		return
	}
	move := func(from, into *[]netip.Addr) bool {
		if len(*from) == 0 || len(*into) >= 2 || !slices.Contains(to.families, portal.FamilyOf((*from)[0])) {
			return false
		}
		a := (*from)[0]
		*from = (*from)[1:]
		*into = append(*into, a)
		m.owner[a] = to.key
		m.touch(to.key)
		m.logf("%v from %v to %v", a, s.key, to.key)
		return true
	}
	if to.lb && move(&s.lbIPs, &to.lbIPs) {
		return
	}
	move(&s.extIPs, &to.extIPs)
}
