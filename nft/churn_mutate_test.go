package nft

import (
	"net/netip"
	"slices"
	"strconv"

	"github.com/onehop/onehop/portal"
)

// The random valid mutations TestChurn applies to its model.

// mutate applies one random valid mutation.
func (m *churnModel) mutate() {
	s := m.pick()
	if s == nil || m.rng.IntN(20) == 0 {
		m.create()
		return
	}
	k := s.key
	m.touch(k)
	switch m.rng.IntN(26) {
	case 0:
		m.delete(s)
		m.logf("delete %v", k)
	case 1:
		// Deleted and re-created under the same name in one batch.
		m.delete(s)
		m.logf("delete %v (to re-create it)", k)
		m.createAs(k)
	case 2:
		typ := m.rng.IntN(3)
		m.setType(s, typ)
		m.logf("%v: type %d", k, typ)
	case 3:
		m.addPort(s)
		m.logf("%v: add a port", k)
	case 4:
		if len(s.ports) > 1 {
			i := m.rng.IntN(len(s.ports))
			m.removePort(s, i)
			m.logf("%v: remove port %d", k, i)
		}
	case 5:
		i := m.rng.IntN(len(s.ports))
		p := uint16(80 + m.rng.IntN(3))
		for j, q := range s.ports {
			if j != i && q.proto == s.ports[i].proto && q.port == p {
				return
			}
		}
		s.ports[i].port = p
		m.logf("%v: port %s now %d", k, s.ports[i].name, p)
	case 6:
		fams := m.randomFamilies()
		if m.setFamilies(s, fams) {
			m.logf("%v: families %v", k, fams)
		}
	case 7:
		if s.typ != typeClusterIP {
			s.extLocal = !s.extLocal
			if s.extLocal && s.typ == typeLoadBalancer && s.hcPort == 0 {
				s.hcPort = m.nodePort()
			}
			m.logf("%v: externalTrafficPolicy Local=%v", k, s.extLocal)
		}
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
		if s.typ == typeLoadBalancer {
			s.ranges = nil
			for _, p := range churnRanges {
				if m.rng.IntN(3) == 0 {
					s.ranges = append(s.ranges, p)
				}
			}
			m.logf("%v: source ranges %v", k, s.ranges)
		}
	case 11, 12, 13:
		m.addEP(s)
		m.logf("%v: add an endpoint (%d)", k, len(s.eps))
	case 14, 15:
		if len(s.eps) > 0 {
			i := m.rng.IntN(len(s.eps))
			m.logf("%v: remove endpoint %v", k, s.eps[i].addr4)
			s.eps = slices.Delete(s.eps, i, i+1)
		}
	case 16:
		// A pod replaced: one endpoint out, another in.
		if len(s.eps) > 0 {
			i := m.rng.IntN(len(s.eps))
			old := s.eps[i]
			s.eps = slices.Delete(s.eps, i, i+1)
			m.addEP(s)
			m.logf("%v: replace endpoint %v", k, old.addr4)
		}
	case 17, 18:
		// Ready -> terminating (serving or not) -> gone, or back.
		if len(s.eps) > 0 {
			i := m.rng.IntN(len(s.eps))
			e := &s.eps[i]
			e.ready, e.serving = !e.ready, m.rng.IntN(2) == 0
			if m.rng.IntN(4) == 0 {
				e.local = !e.local
			}
			m.logf("%v: endpoint %v ready=%v serving=%v local=%v", k, e.addr4, e.ready, e.serving, e.local)
		}
	case 19:
		if len(s.extIPs) > 0 && m.rng.IntN(2) == 0 {
			i := m.rng.IntN(len(s.extIPs))
			m.release(s.extIPs[i])
			m.logf("%v: drop external IP %v", k, s.extIPs[i])
			s.extIPs = slices.Delete(s.extIPs, i, i+1)
		} else if len(s.extIPs) < 3 {
			f := s.families[m.rng.IntN(len(s.families))]
			if a, ok := m.take(k, m.extPool(f), 12); ok {
				s.extIPs = append(s.extIPs, a)
				m.logf("%v: add external IP %v", k, a)
			}
		}
	case 20:
		if s.typ != typeLoadBalancer {
			return
		}
		if len(s.lbIPs) > 0 && m.rng.IntN(2) == 0 {
			i := m.rng.IntN(len(s.lbIPs))
			m.release(s.lbIPs[i])
			m.logf("%v: drop LB IP %v", k, s.lbIPs[i])
			s.lbIPs = slices.Delete(s.lbIPs, i, i+1)
		} else if len(s.lbIPs) < 2 {
			f := s.families[m.rng.IntN(len(s.families))]
			if a, ok := m.take(k, m.lbPool(f), 12); ok {
				s.lbIPs = append(s.lbIPs, a)
				m.logf("%v: add LB IP %v", k, a)
			}
		}
	case 21, 24, 25:
		m.handOver(s)
	case 22:
		m.mutateNode()
	case 23:
		m.mutatePodIPs()
	}
}

// handOver moves an external or LB IP, with its ports, from s to another
// Service in the same batch: the address is freed by one and taken by the
// other.
func (m *churnModel) handOver(s *churnSvc) {
	to := m.pick()
	if to == s {
		return
	}
	if len(s.lbIPs) > 0 && to.typ == typeLoadBalancer && len(to.lbIPs) < 2 {
		a := s.lbIPs[0]
		if !slices.Contains(to.families, portal.FamilyOf(a)) {
			return
		}
		s.lbIPs = s.lbIPs[1:]
		to.lbIPs = append(to.lbIPs, a)
		m.owner[a] = to.key
		m.touch(to.key)
		m.logf("LB IP %v from %v to %v", a, s.key, to.key)
		return
	}
	if len(s.extIPs) > 0 && len(to.extIPs) < 3 {
		a := s.extIPs[0]
		if !slices.Contains(to.families, portal.FamilyOf(a)) {
			return
		}
		s.extIPs = s.extIPs[1:]
		to.extIPs = append(to.extIPs, a)
		m.owner[a] = to.key
		m.touch(to.key)
		m.logf("external IP %v from %v to %v", a, s.key, to.key)
	}
}

func (m *churnModel) mutateNode() {
	a := churnNodeAddrs[m.rng.IntN(len(churnNodeAddrs))]
	if i := slices.Index(m.npAddrs, a); i >= 0 {
		m.npAddrs = slices.Delete(slices.Clone(m.npAddrs), i, i+1)
		m.logf("node address %v gone", a)
	} else {
		m.npAddrs = append(slices.Clone(m.npAddrs), a)
		m.logf("node address %v added", a)
	}
}

func (m *churnModel) mutatePodIPs() {
	ips := slices.Clone(m.podIPs)
	if len(ips) > 0 && m.rng.IntN(2) == 0 {
		i := m.rng.IntN(len(ips))
		m.logf("pod external IP %v gone", ips[i].External)
		ips = slices.Delete(ips, i, i+1)
	} else {
		ext := addrN("203.0.113.200", m.rng.IntN(10))
		pod := m.rng.IntN(churnPods + 4)
		var p netip.Addr
		if pod < churnPods {
			p = podIP(pod)
		} else {
			p = addrN("10.244.150.0", pod)
		}
		for _, e := range ips {
			if e.External == ext || e.Pod == p {
				return
			}
		}
		ips = append(ips, portal.PodExternalIP{External: ext, Pod: p, Name: portal.ServiceKey{Namespace: "pods", Name: "pod" + strconv.Itoa(pod)}})
		slices.SortFunc(ips, func(a, b portal.PodExternalIP) int { return a.External.Compare(b.External) })
		m.logf("pod external IP %v -> %v", ext, p)
	}
	m.podIPs = ips
}
