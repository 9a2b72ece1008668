package ipvs

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// churnPort is one port of a model Service. TCP ports reach the pods'
// echo server on 8080, UDP ports on 5353.
type churnPort struct {
	name     string
	proto    portal.Protocol
	port     uint16
	nodePort uint16
}

// churnEP is an endpoint: pod i (1-based) of the test network.
type churnEP struct {
	pod     int
	ready   bool
	serving bool // when not ready: terminating and still serving
	local   bool
}

type churnSvc struct {
	key       portal.ServiceKey
	families  []portal.Family
	clusterIP map[portal.Family]netip.Addr
	lb        bool // type LoadBalancer (NodePorts come with nodePort != 0)
	ports     []churnPort
	extIPs    []netip.Addr
	lbIPs     []netip.Addr
	ranges    []netip.Prefix
	extLocal  bool
	intLocal  bool
	affinity  uint32
	sched     string
	eps       []churnEP
}

// churnModel is what TestChurn mutates, with the pools its addresses and
// node ports come from: each belongs to at most one Service at a time, as
// portal leaves them once conflicts are resolved.
type churnModel struct {
	rng     *rand.Rand
	cfg     dataplane.Config
	cfgName string
	svcs    map[portal.ServiceKey]*churnSvc
	built   map[portal.ServiceKey]*portal.Service
	dirty   []portal.ServiceKey
	owner   map[netip.Addr]portal.ServiceKey
	ports   map[uint16]bool
	npAddrs []netip.Addr
	next    int // for Service names
	log     []string
}

var (
	// churnNodeAddrs are addresses of the node namespace NodePorts may be
	// served on; the client reaches each of them.
	churnNodeAddrs = []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP6),
		netip.MustParseAddr(podGW(1)), netip.MustParseAddr("fd00:244:1::1")}
	churnRanges = []netip.Prefix{
		netip.MustParsePrefix("192.168.50.0/24"), // the client's
		netip.MustParsePrefix("192.168.60.0/24"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.168.50.2/32"), // the client
		netip.MustParsePrefix("fd00:50::/64"),    // the client's
		netip.MustParsePrefix("fd00:60::/64"),
		netip.MustParsePrefix("0.0.0.0/0"),
	}
	churnScheds = []string{"", "", "rr", "wrr", "sh", "mh", "lc"}
)

func newChurnModel(seed uint64) *churnModel {
	m := &churnModel{
		rng:     rand.New(rand.NewPCG(seed, seed>>32|seed<<32)),
		svcs:    map[portal.ServiceKey]*churnSvc{},
		built:   map[portal.ServiceKey]*portal.Service{},
		owner:   map[netip.Addr]portal.ServiceKey{},
		ports:   map[uint16]bool{},
		npAddrs: []netip.Addr{churnNodeAddrs[0], churnNodeAddrs[1]},
	}
	c := churnConfigs[seed%uint64(len(churnConfigs))]
	m.cfg, m.cfgName = c.cfg, c.name
	for range churnMaxServices / 2 {
		m.create()
	}
	return m
}

// churnConfigs are the backend configurations a seed picks from: what is
// masqueraded, and whether source ranges apply to NodePorts, differ.
var churnConfigs = []struct {
	name string
	cfg  dataplane.Config
}{
	{"cluster CIDRs", testCfg},
	{"no cluster CIDRs", dataplane.Config{}},
	{"masquerade all", dataplane.Config{ClusterCIDRs: testCfg.ClusterCIDRs, MasqueradeAll: true}},
	{"source ranges on NodePorts", dataplane.Config{ClusterCIDRs: testCfg.ClusterCIDRs, SourceRangesOnNodePorts: true}},
}

func (m *churnModel) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

func (m *churnModel) touch(k portal.ServiceKey) {
	if !slices.Contains(m.dirty, k) {
		m.dirty = append(m.dirty, k)
	}
}

// addr returns address i of a pool: 10.96.0.0/16 style for IPv4,
// fd00:96::/64 style for IPv6.
func poolAddr(f portal.Family, pool byte, i int) netip.Addr {
	if f == portal.IPv4 {
		return netip.AddrFrom4([4]byte{10, pool, byte(i >> 8), byte(i)})
	}
	return netip.AddrFrom16([16]byte{0: 0xfd, 3: pool, 14: byte(i >> 8), 15: byte(i)})
}

// take gives Service k a free address of a pool of size n.
func (m *churnModel) take(k portal.ServiceKey, f portal.Family, pool byte, n int) (netip.Addr, bool) {
	for range 4 {
		a := poolAddr(f, pool, 1+m.rng.IntN(n))
		if _, used := m.owner[a]; !used {
			m.owner[a] = k
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (m *churnModel) nodePort() uint16 {
	for {
		p := uint16(30000 + m.rng.IntN(200))
		if !m.ports[p] {
			m.ports[p] = true
			return p
		}
	}
}

func (m *churnModel) families() []portal.Family {
	switch m.rng.IntN(4) {
	case 0:
		return []portal.Family{portal.IPv6}
	case 1:
		return []portal.Family{portal.IPv4, portal.IPv6}
	}
	return []portal.Family{portal.IPv4}
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
