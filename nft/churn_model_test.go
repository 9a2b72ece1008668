package nft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// The model TestChurn mutates: the Services a node serves, the pools their
// addresses and node ports come from, and the portals and snapshot the
// backend is given for them.

// churnEP is one endpoint of a model Service: a pod with an address per
// family.
type churnEP struct {
	pod          int // a pod of the topology, or -1: an address nothing answers on
	addr4, addr6 netip.Addr
	local        bool
	ready        bool
	serving      bool // when not ready: terminating, and still serving
}

type churnPort struct {
	name     string
	proto    portal.Protocol
	port     uint16
	nodePort uint16
}

// Service types.
const (
	typeClusterIP = iota
	typeNodePort
	typeLoadBalancer
)

type churnSvc struct {
	key        portal.ServiceKey
	live       bool // endpoints are pods of the topology, on their echo port
	families   []portal.Family
	clusterIP  map[portal.Family]netip.Addr
	typ        int
	ports      []churnPort
	targetPort uint16
	extIPs     []netip.Addr
	lbIPs      []netip.Addr
	ranges     []netip.Prefix
	extLocal   bool
	intLocal   bool
	hcPort     uint16
	affinity   uint32
	eps        []churnEP
}

// churnModel is the desired state TestChurn mutates, with the pools its
// addresses and ports come from: an address or node port belongs to at
// most one Service at a time, as portal leaves it once conflicts are
// resolved.
type churnModel struct {
	rng    *rand.Rand
	protos []portal.Protocol
	svcs   map[portal.ServiceKey]*churnSvc
	built  map[portal.ServiceKey]*portal.Service
	dirty  []portal.ServiceKey
	owner  map[netip.Addr]portal.ServiceKey // cluster, external and LB IPs taken
	ports  map[uint16]bool                  // node ports taken

	npAddrs []netip.Addr
	podIPs  []portal.PodExternalIP
	log     []string // this batch's mutations
}

// The address pools.
var (
	churnNodeAddrs = []netip.Addr{
		netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP6),
		netip.MustParseAddr(nsutil.UplinkIP), netip.MustParseAddr(nsutil.UplinkIP6),
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8:77::1"),
	}
	churnRanges = []netip.Prefix{
		netip.MustParsePrefix("198.51.100.0/25"), // the client
		netip.MustParsePrefix("198.51.100.128/25"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("2001:db8:1::/64"), // the client
		netip.MustParsePrefix("2001:db8:9::/64"),
	}
)

func addrN(base string, i int) netip.Addr {
	a := netip.MustParseAddr(base).As16()
	if netip.MustParseAddr(base).Is4() {
		b := netip.MustParseAddr(base).As4()
		b[2] += byte(i >> 8)
		b[3] += byte(i)
		return netip.AddrFrom4(b)
	}
	a[14] += byte(i >> 8)
	a[15] += byte(i)
	return netip.AddrFrom16(a)
}

func newChurnModel(seed uint64, sctp bool) *churnModel {
	m := &churnModel{
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		protos: []portal.Protocol{portal.TCP, portal.UDP},
		svcs:   map[portal.ServiceKey]*churnSvc{},
		built:  map[portal.ServiceKey]*portal.Service{},
		owner:  map[netip.Addr]portal.ServiceKey{},
		ports:  map[uint16]bool{},
	}
	if sctp {
		m.protos = append(m.protos, portal.SCTP)
	}
	m.npAddrs = []netip.Addr{churnNodeAddrs[0], churnNodeAddrs[1]}
	for range churnMaxServices / 2 {
		m.create()
	}
	return m
}

func (m *churnModel) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

func (m *churnModel) journal() string {
	return "\t" + strings.Join(m.log, "\n\t")
}

func (m *churnModel) done() { m.log = m.log[:0] }

func (m *churnModel) touch(k portal.ServiceKey) {
	if !slices.Contains(m.dirty, k) {
		m.dirty = append(m.dirty, k)
	}
}

// take picks a free address of family f from a pool of n addresses.
func (m *churnModel) take(k portal.ServiceKey, pool string, n int) (netip.Addr, bool) {
	for range 8 {
		a := addrN(pool, 1+m.rng.IntN(n))
		if _, taken := m.owner[a]; !taken {
			m.owner[a] = k
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (m *churnModel) release(a netip.Addr) { delete(m.owner, a) }

func (m *churnModel) clusterPool(f portal.Family) string {
	if f == portal.IPv4 {
		return "10.96.1.0"
	}
	return "fd00:96::1:0"
}

func (m *churnModel) extPool(f portal.Family) string {
	if f == portal.IPv4 {
		return "203.0.113.0"
	}
	return "2001:db8:e::"
}

func (m *churnModel) lbPool(f portal.Family) string {
	if f == portal.IPv4 {
		return "198.18.0.0"
	}
	return "2001:db8:f::"
}

func (m *churnModel) nodePort() uint16 {
	for {
		p := uint16(30000 + m.rng.IntN(300))
		if !m.ports[p] {
			m.ports[p] = true
			return p
		}
	}
}

func (m *churnModel) randomEP(s *churnSvc) churnEP {
	ep := churnEP{pod: -1, local: m.rng.IntN(3) > 0, ready: m.rng.IntN(5) > 0, serving: m.rng.IntN(2) == 0}
	if s.live {
		ep.pod = m.rng.IntN(churnPods)
		ep.addr4, ep.addr6 = podIP(ep.pod), podIP6(ep.pod)
	} else {
		i := m.rng.IntN(500)
		ep.addr4 = addrN("10.244.200.0", i)
		ep.addr6 = addrN("fd00:244:0:c8::", i)
	}
	return ep
}

func (m *churnModel) addEP(s *churnSvc) {
	ep := m.randomEP(s)
	for _, e := range s.eps {
		if e.addr4 == ep.addr4 {
			return
		}
	}
	s.eps = append(s.eps, ep)
}

func (m *churnModel) randomFamilies() []portal.Family {
	switch m.rng.IntN(4) {
	case 0:
		return []portal.Family{portal.IPv6}
	case 1:
		return []portal.Family{portal.IPv4, portal.IPv6}
	}
	return []portal.Family{portal.IPv4}
}

func (m *churnModel) addPort(s *churnSvc) {
	if len(s.ports) >= 4 {
		return
	}
	for range 4 {
		p := churnPort{proto: m.protos[m.rng.IntN(len(m.protos))], port: uint16(80 + m.rng.IntN(3))}
		clash := false
		names := map[string]bool{}
		for _, q := range s.ports {
			clash = clash || (q.proto == p.proto && q.port == p.port)
			names[q.name] = true
		}
		if clash {
			continue
		}
		for i := 0; ; i++ {
			if n := "p" + strconv.Itoa(i); !names[n] {
				p.name = n
				break
			}
		}
		if s.typ != typeClusterIP {
			p.nodePort = m.nodePort()
		}
		s.ports = append(s.ports, p)
		return
	}
}

func (m *churnModel) removePort(s *churnSvc, i int) {
	if s.ports[i].nodePort != 0 {
		delete(m.ports, s.ports[i].nodePort)
	}
	s.ports = slices.Delete(s.ports, i, i+1)
}

// setType changes a Service's type, taking and freeing node ports, LB IPs
// and the health-check port.
func (m *churnModel) setType(s *churnSvc, typ int) {
	s.typ = typ
	for i := range s.ports {
		switch {
		case typ == typeClusterIP && s.ports[i].nodePort != 0:
			delete(m.ports, s.ports[i].nodePort)
			s.ports[i].nodePort = 0
		case typ != typeClusterIP && s.ports[i].nodePort == 0:
			s.ports[i].nodePort = m.nodePort()
		}
	}
	if typ != typeLoadBalancer {
		for _, a := range s.lbIPs {
			m.release(a)
		}
		s.lbIPs, s.ranges = nil, nil
		if s.hcPort != 0 {
			delete(m.ports, s.hcPort)
			s.hcPort = 0
		}
	}
	if typ == typeClusterIP {
		s.extLocal = false
	}
}

func (m *churnModel) setFamilies(s *churnSvc, fams []portal.Family) bool {
	next := map[portal.Family]netip.Addr{}
	for _, f := range fams {
		if a, ok := s.clusterIP[f]; ok {
			next[f] = a
			continue
		}
		a, ok := m.take(s.key, m.clusterPool(f), 64)
		if !ok {
			for g, a := range next {
				if s.clusterIP[g] != a {
					m.release(a)
				}
			}
			return false
		}
		next[f] = a
	}
	for f, a := range s.clusterIP {
		if _, ok := next[f]; !ok {
			m.release(a)
		}
	}
	s.families, s.clusterIP = fams, next
	return true
}

func (m *churnModel) create() {
	m.createAs(portal.ServiceKey{Namespace: "ns" + strconv.Itoa(m.rng.IntN(3)), Name: "s" + strconv.Itoa(m.rng.IntN(churnMaxServices*2))})
}

// createAs adds a Service named k with random ways in, ports and
// endpoints, unless k exists or the model is full.
func (m *churnModel) createAs(k portal.ServiceKey) {
	if len(m.svcs) >= churnMaxServices {
		return
	}
	if _, ok := m.svcs[k]; ok {
		return
	}
	s := &churnSvc{key: k, live: m.rng.IntN(3) > 0, targetPort: nsutil.EchoPort, clusterIP: map[portal.Family]netip.Addr{}}
	if !s.live {
		s.targetPort = uint16(9000 + m.rng.IntN(100))
	}
	if !m.setFamilies(s, m.randomFamilies()) {
		return
	}
	for range 1 + m.rng.IntN(2) {
		m.addPort(s)
	}
	m.setType(s, m.rng.IntN(3))
	for range m.rng.IntN(4) {
		m.addEP(s)
	}
	m.svcs[k] = s
	m.touch(k)
	m.logf("create %v live=%v families=%v type=%d", k, s.live, s.families, s.typ)
}

func (m *churnModel) delete(s *churnSvc) {
	for _, a := range s.clusterIP {
		m.release(a)
	}
	for _, a := range append(slices.Clone(s.extIPs), s.lbIPs...) {
		m.release(a)
	}
	for _, p := range s.ports {
		if p.nodePort != 0 {
			delete(m.ports, p.nodePort)
		}
	}
	if s.hcPort != 0 {
		delete(m.ports, s.hcPort)
	}
	delete(m.svcs, s.key)
	m.touch(s.key)
}

func (m *churnModel) pick() *churnSvc {
	if len(m.svcs) == 0 {
		return nil
	}
	keys := make([]portal.ServiceKey, 0, len(m.svcs))
	for k := range m.svcs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	return m.svcs[keys[m.rng.IntN(len(keys))]]
}

// portals builds the model Service as portal.Build presents it.
func (s *churnSvc) portals() *portal.Service {
	out := &portal.Service{Key: s.key}
	for _, f := range s.families {
		addr := func(e churnEP) netip.AddrPort {
			if f == portal.IPv4 {
				return netip.AddrPortFrom(e.addr4, s.targetPort)
			}
			return netip.AddrPortFrom(e.addr6, s.targetPort)
		}
		pick := func(local bool) []netip.AddrPort {
			var ready, term []netip.AddrPort
			for _, e := range s.eps {
				if local && !e.local {
					continue
				}
				if e.ready {
					ready = append(ready, addr(e))
				} else if e.serving {
					term = append(term, addr(e))
				}
			}
			if len(ready) == 0 {
				ready = term
			}
			slices.SortFunc(ready, netip.AddrPort.Compare)
			return slices.Compact(ready)
		}
		var ext, lbs []netip.Addr
		for _, a := range s.extIPs {
			if portal.FamilyOf(a) == f {
				ext = append(ext, a)
			}
		}
		for _, a := range s.lbIPs {
			if portal.FamilyOf(a) == f {
				lbs = append(lbs, a)
			}
		}
		slices.SortFunc(ext, netip.Addr.Compare)
		slices.SortFunc(lbs, netip.Addr.Compare)
		localReady := 0
		for _, e := range s.eps {
			if e.local && e.ready {
				localReady++
			}
		}
		for _, sp := range s.ports {
			p := &portal.Portal{
				Key:              portal.PortKey{Service: s.key, Port: sp.name, Protocol: sp.proto, Family: f},
				Port:             sp.port,
				ClusterIPs:       []netip.Addr{s.clusterIP[f]},
				NodePort:         sp.nodePort,
				ExternalIPs:      ext,
				LoadBalancerIPs:  lbs,
				InternalLocal:    s.intLocal,
				Affinity:         portal.Affinity{TimeoutSeconds: s.affinity},
				ClusterEndpoints: pick(false),
				LocalEndpoints:   pick(true),
				LocalReady:       localReady,
			}
			p.ExternalLocal = s.extLocal && p.HasExternal()
			p.Hairpin = allHairpin(p) // every test pod hangs off this node
			if s.typ == typeLoadBalancer {
				for _, r := range s.ranges {
					if portal.FamilyOf(r.Addr()) == f {
						p.SourceRanges = append(p.SourceRanges, r)
					}
				}
				if p.ExternalLocal {
					p.HealthCheckNodePort = s.hcPort
				}
			}
			out.Portals = append(out.Portals, p)
		}
	}
	churnSortPortals(out.Portals)
	return out
}

func churnSortPortals(ps []*portal.Portal) {
	slices.SortFunc(ps, func(a, b *portal.Portal) int { return strings.Compare(a.Key.String(), b.Key.String()) })
}

// snapshot returns the model's state, with the Services changed since the
// last one (in random order) as Dirty.
func (m *churnModel) snapshot() *portal.Snapshot {
	m.rng.Shuffle(len(m.dirty), func(i, j int) { m.dirty[i], m.dirty[j] = m.dirty[j], m.dirty[i] })
	for _, k := range m.dirty {
		if s, ok := m.svcs[k]; ok {
			m.built[k] = s.portals()
		} else {
			delete(m.built, k)
		}
	}
	snap := &portal.Snapshot{
		Node:     portal.Node{Name: "node", NodePortAddrs: slices.Clone(m.npAddrs), PodExternalIPs: slices.Clone(m.podIPs)},
		Services: make(map[portal.ServiceKey]*portal.Service, len(m.built)),
		Dirty:    m.dirty,
	}
	for k, s := range m.built {
		snap.Services[k] = s
	}
	m.dirty = nil
	return snap
}
