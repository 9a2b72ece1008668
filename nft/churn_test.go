package nft

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

var churnSeed = flag.Uint64("churn.seed", 0, "seed of TestChurn's mutations (default: $ONEHOP_CHURN_SEED, else time-based)")

// TestChurn is a model-based test of incremental syncs against the real
// kernel. A seeded generator applies random valid mutations to a model of
// the Services a node serves (types and ways in, ports, protocols, both
// families, traffic policies, affinity, source ranges, endpoints ready and
// terminating, addresses handed from one Service to another, Services
// deleted and re-created, node addresses, pod external IPs), in batches
// synced incrementally with the Dirty list set; every few batches a full
// sync, and now and then a new Backend on the same table, as after an agent
// restart. After every batch:
//
//   - the sync did not fail;
//   - the table read back equals the one a fresh Backend builds from the
//     same snapshot in an empty namespace with one full sync (chain ids and
//     endpoint-map shards normalised away, endpoints resolved per rule), and
//     every way into every portal of the model is in it;
//   - requests from the client to a few sampled ways in reach an endpoint
//     the model allows, or are refused when the Service has none.
//
// A failure names the seed and the batch; -churn.seed=N replays it.
// ONEHOP_CHURN_SECONDS sets how long it runs (default 20),
// ONEHOP_CHURN_BATCH the average size of a large batch (default 200; a third
// of the batches are small). The mutation rate it reaches is logged; the
// fixed cost of checking a batch (reading two tables back, building the
// fresh one) bounds it, so larger batches reach more mutations a second.
func TestChurn(t *testing.T) {
	t.Parallel()
	seed := *churnSeed
	if seed == 0 {
		if v, err := strconv.ParseUint(os.Getenv("ONEHOP_CHURN_SEED"), 10, 64); err == nil {
			seed = v
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	seconds := envInt("ONEHOP_CHURN_SECONDS", 20)
	batchSize := envInt("ONEHOP_CHURN_BATCH", churnBatch)
	t.Logf("churn seed %d (replay: go test ./nft -run TestChurn -churn.seed=%d)", seed, seed)

	tp := newTopo(t, churnPods)
	oracleNS := nsutil.New(t, "ohx-")
	m := newChurnModel(seed, hasSCTP())
	ctx := context.Background()

	var batches, mutations, fulls, restarts, probes int
	var syncTime, readTime, oracleTime, probeTime time.Duration
	start := time.Now()
	deadline := start.Add(time.Duration(seconds) * time.Second)
	for batch := 1; time.Now().Before(deadline); batch++ {
		kind := "incremental"
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, batch %d (%s sync): %s\nreplay: go test ./nft -run TestChurn -churn.seed=%d", seed, batch, kind, fmt.Sprintf(format, args...), seed)
		}
		// A third of the batches are a few mutations, so that single
		// changes are checked on their own; the others average batchSize.
		n := 1 + m.rng.IntN(2*batchSize)
		if m.rng.IntN(3) == 0 {
			n = 1 + m.rng.IntN(8)
		}
		for range n {
			m.mutate()
		}
		mutations += n
		snap := m.snapshot()
		full := batch%churnFullEvery == 0
		if batch%churnRestartEvery == 0 {
			tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
			full = true
			restarts++
			kind = "restart's full"
		}
		if full {
			fulls++
			if kind == "incremental" {
				kind = "full"
			}
		}
		syncStart := time.Now()
		st, err := tp.b.Sync(ctx, snap, full)
		syncTime += time.Since(syncStart)
		if err != nil {
			fail("sync (full=%v) of %d mutations failed: %v\nmutations:\n%s", full, n, err, m.journal())
		}
		if len(st.Panics) > 0 {
			fail("sync panicked: %v", st.Panics)
		}
		if err := tp.b.Check(ctx); err != nil {
			fail("the drift check after the sync: %v", err)
		}

		checkStart := time.Now()
		got, err := readKernelOf(tp.node.FD(), tp.b)
		if err != nil {
			fail("read the table: %v", err)
		}
		if msg := m.checkWaysIn(got); msg != "" {
			fail("the table differs from the model:\n%s\nmutations:\n%s", msg, m.journal())
		}
		oracleStart := time.Now()
		readTime += oracleStart.Sub(checkStart)
		oracle := New(tp.b.cfg, WithNetNS(oracleNS.FD()))
		if err := oracle.Cleanup(ctx); err != nil {
			fail("oracle cleanup: %v", err)
		}
		if _, err := oracle.Sync(ctx, snap, true); err != nil {
			fail("full sync of the same snapshot into an empty namespace failed: %v", err)
		}
		want, err := readKernelOf(oracleNS.FD(), oracle)
		if err != nil {
			fail("read the oracle's table: %v", err)
		}
		if nw, ng := churnNormal(want), churnNormal(got); nw != ng {
			d := lineDiff(nw, ng)
			if d == "" {
				d = "the same lines in another order:\n" + ng
			}
			fail("the table after %d mutations (full=%v) differs from a fresh full sync of the same snapshot (- fresh, + incremental):\n%s\nmutations:\n%s", n, full, d, m.journal())
		}
		probeStart := time.Now()
		oracleTime += probeStart.Sub(oracleStart)
		for _, p := range m.probes(churnProbes) {
			probes++
			if msg := p.run(tp); msg != "" {
				fail("%s\nmutations:\n%s", msg, m.journal())
			}
		}
		probeTime += time.Since(probeStart)
		batches++
		m.done()
	}
	elapsed := time.Since(start)
	t.Logf("churn: time in syncs %v, reading back %v, the fresh table %v, requests %v", syncTime.Round(time.Millisecond), readTime.Round(time.Millisecond), oracleTime.Round(time.Millisecond), probeTime.Round(time.Millisecond))
	t.Logf("churn: %d mutations in %d batches (%d full syncs, %d restarts) checked in %v: %.0f mutations/s overall; syncs took %v (%.0f mutations/s of sync time); %d requests; %d Services at the end",
		mutations, batches, fulls, restarts, elapsed.Round(time.Millisecond), float64(mutations)/elapsed.Seconds(),
		syncTime.Round(time.Millisecond), float64(mutations)/syncTime.Seconds(), probes, len(m.svcs))
}

// Sizes of TestChurn.
const (
	churnPods         = 4
	churnMaxServices  = 40
	churnBatch        = 200 // mutations in a large batch, on average (ONEHOP_CHURN_BATCH)
	churnFullEvery    = 10
	churnRestartEvery = 37
	churnProbes       = 4 // requests per batch
)

// hasSCTP reports whether this kernel has SCTP sockets; without them the
// model leaves SCTP out, since no request could prove it.
func hasSCTP() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

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

// checkWaysIn compares every way into every portal of the model with the
// entries read back from the kernel, and checks that each portal's
// endpoints are among the model's.
func (m *churnModel) checkWaysIn(k *kernelTable) string {
	dump := k.dump()
	got := map[string]map[string]bool{}
	eps := map[string][]string{}
	for _, p := range dump.Ports {
		got[p.Service] = map[string]bool{}
		for _, e := range p.Entries {
			got[p.Service][e.Kind+" "+e.Addr] = true
		}
		for _, e := range p.Endpoints {
			eps[p.Service] = append(eps[p.Service], e.Addr)
		}
	}
	var problems []string
	seen := map[string]bool{}
	for _, svc := range m.built {
		for _, p := range svc.Portals {
			name := p.Key.String()
			seen[name] = true
			proto := p.Key.Protocol.String()
			want := map[string]bool{}
			for _, a := range p.ClusterIPs {
				want[fmt.Sprintf("%s %s/%s", entryClusterIP, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			for _, a := range p.ExternalIPs {
				want[fmt.Sprintf("%s %s/%s", entryExternalIP, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			for _, a := range p.LoadBalancerIPs {
				want[fmt.Sprintf("%s %s/%s", entryLoadBalancer, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			if p.NodePort != 0 {
				want[fmt.Sprintf("%s :%d/%s", entryNodePort, p.NodePort, proto)] = true
			}
			for w := range want {
				if !got[name][w] {
					problems = append(problems, fmt.Sprintf("%s: %s missing", name, w))
				}
			}
			for g := range got[name] {
				if !want[g] {
					problems = append(problems, fmt.Sprintf("%s: %s not wanted", name, g))
				}
			}
			allowed := map[string]bool{}
			for _, e := range append(slices.Clone(p.ClusterEndpoints), p.LocalEndpoints...) {
				allowed[e.String()] = true
			}
			for _, e := range eps[name] {
				if !allowed[e] {
					problems = append(problems, fmt.Sprintf("%s: endpoint %s not the model's", name, e))
				}
			}
		}
	}
	for name := range got {
		if !seen[name] {
			problems = append(problems, fmt.Sprintf("%s: not in the model, in the kernel", name))
		}
	}
	sort.Strings(problems)
	if len(problems) > 20 {
		problems = append(problems[:20], fmt.Sprintf("... and %d more", len(problems)-20))
	}
	return strings.Join(problems, "\n")
}

// churnProbe is one request from the client or a pod and what may answer it.
type churnProbe struct {
	from          int // a pod, or -1: the client
	network, addr string
	what          string
	allowed       map[string]bool // pod names; empty: the request must be refused
}

// probes samples up to n ways into live Services (and pod external IPs)
// the client can try, with the endpoints the model allows there.
func (m *churnModel) probes(n int) []churnProbe {
	var all []churnProbe
	names := func(eps []netip.AddrPort) map[string]bool {
		out := map[string]bool{}
		for _, e := range eps {
			for i := range churnPods {
				if e.Addr() == podIP(i) || e.Addr() == podIP6(i) {
					out[nsutil.PodName(i)] = true
				}
			}
		}
		return out
	}
	keys := make([]portal.ServiceKey, 0, len(m.built))
	for k := range m.built {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		if !m.svcs[k].live {
			continue
		}
		for _, p := range m.built[k].Portals {
			network := map[portal.Protocol]string{portal.TCP: "tcp", portal.UDP: "udp"}[p.Key.Protocol]
			if network == "" {
				continue
			}
			hasEps := len(p.ClusterEndpoints) > 0
			internal := p.ClusterEndpoints
			if p.InternalLocal {
				internal = p.LocalEndpoints
			}
			// From the client, outside the cluster: external ways in take
			// the Local policy's endpoints (none: dropped), else all.
			external := p.ClusterEndpoints
			if p.ExternalLocal {
				external = p.LocalEndpoints
			}
			// From a pod, external ways in take all endpoints: the Local
			// policy's chain sends pods on.
			pod := m.rng.IntN(churnPods)
			podAddr := podIP(pod)
			if p.Key.Family == portal.IPv6 {
				podAddr = podIP6(pod)
			}
			add := func(what string, ap netip.AddrPort, eps []netip.AddrPort) {
				m.addProbe(&all, churnProbe{from: -1, network: network, addr: ap.String(), what: fmt.Sprintf("%s %s of %s from the client", what, ap, p.Key)}, eps, hasEps, names)
			}
			addFromPod := func(what string, ap netip.AddrPort, eps []netip.AddrPort) {
				m.addProbe(&all, churnProbe{from: pod, network: network, addr: ap.String(), what: fmt.Sprintf("%s %s of %s from %s", what, ap, p.Key, nsutil.PodName(pod))}, eps, hasEps, names)
			}
			for _, a := range p.ClusterIPs {
				addFromPod(entryClusterIP, netip.AddrPortFrom(a, p.Port), internal)
			}
			for _, a := range p.ExternalIPs {
				addFromPod(entryExternalIP, netip.AddrPortFrom(a, p.Port), p.ClusterEndpoints)
			}
			for _, a := range p.LoadBalancerIPs {
				in := len(p.SourceRanges) == 0
				for _, r := range p.SourceRanges {
					in = in || r.Contains(podAddr)
				}
				if in { // outside the ranges: dropped, with or without endpoints
					addFromPod(entryLoadBalancer, netip.AddrPortFrom(a, p.Port), p.ClusterEndpoints)
				}
			}
			if p.NodePort != 0 && slices.Contains(m.npAddrs, nodeAddr(p.Key.Family)) {
				addFromPod(entryNodePort, netip.AddrPortFrom(nodeAddr(p.Key.Family), p.NodePort), p.ClusterEndpoints)
			}
			for _, a := range p.ClusterIPs {
				add(entryClusterIP, netip.AddrPortFrom(a, p.Port), internal)
			}
			for _, a := range p.ExternalIPs {
				add(entryExternalIP, netip.AddrPortFrom(a, p.Port), external)
			}
			for _, a := range p.LoadBalancerIPs {
				in := len(p.SourceRanges) == 0
				for _, r := range p.SourceRanges {
					in = in || r.Contains(netip.MustParseAddr(clientIP)) || r.Contains(netip.MustParseAddr(clientIP6))
				}
				if in { // outside the ranges: dropped, with or without endpoints
					add(entryLoadBalancer, netip.AddrPortFrom(a, p.Port), external)
				}
			}
			if p.NodePort != 0 && slices.Contains(m.npAddrs, nodeAddr(p.Key.Family)) {
				add(entryNodePort, netip.AddrPortFrom(nodeAddr(p.Key.Family), p.NodePort), external)
			}
		}
	}
	for _, e := range m.podIPs {
		for i := range churnPods {
			if e.Pod == podIP(i) {
				all = append(all, churnProbe{from: -1, network: "tcp", addr: netip.AddrPortFrom(e.External, nsutil.EchoPort).String(),
					what: fmt.Sprintf("pod external IP %v of %v", e.External, e.Pod), allowed: map[string]bool{nsutil.PodName(i): true}})
			}
		}
	}
	m.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	return all[:min(n, len(all))]
}

func nodeAddr(f portal.Family) netip.Addr {
	if f == portal.IPv6 {
		return netip.MustParseAddr(nodeIP6)
	}
	return netip.MustParseAddr(nodeIP)
}

// addProbe adds pr, allowed to reach eps: none means refused when the
// portal has no endpoints at all (TCP only: a reset answers at once), and
// dropped otherwise, which no request is spent on.
func (m *churnModel) addProbe(all *[]churnProbe, pr churnProbe, eps []netip.AddrPort, hasEps bool, names func([]netip.AddrPort) map[string]bool) {
	switch {
	case len(eps) > 0:
		pr.allowed = names(eps)
	case !hasEps && pr.network == "tcp":
	default:
		return
	}
	*all = append(*all, pr)
}

func (p churnProbe) run(tp *topo) string {
	from := tp.client
	if p.from >= 0 {
		from = tp.pods[p.from]
	}
	r, err := from.Ask(p.network, p.addr, 2*time.Second)
	if len(p.allowed) == 0 {
		if err == nil {
			return fmt.Sprintf("%s: has no endpoints, yet %s answered", p.what, r.Name)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Sprintf("%s: has no endpoints and must be refused at once, got %v", p.what, err)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf("%s %s: %v (allowed: %v)", p.network, p.what, err, p.allowed)
	}
	if !p.allowed[r.Name] {
		return fmt.Sprintf("%s %s: answered by %s, allowed: %v", p.network, p.what, r.Name, p.allowed)
	}
	return ""
}

// Normalising a table for comparison across processes.
var (
	churnCounter = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	churnChainID = regexp.MustCompile(`0x[0-9a-f]+ \[invalid type\]`)
	churnShard   = regexp.MustCompile(`@endpoints([46])-\d+`)
)

// churnNormal prints the table with what differs between two processes
// programming the same state taken out: chain ids and endpoint-map shards
// are replaced by the endpoints each rule resolves to (index: endpoint),
// counters, the clients remembered for affinity and the affinity sets' own
// timeouts are left out, sets and
// chains are sorted by name. Endpoint-map elements no rule reaches are
// counted, so a leak shows.
func churnNormal(k *kernelTable) string {
	var blocks []string
	reached := map[string]map[string]bool{}
	for _, c := range k.chainList {
		txt := k.chainText(c)
		txt = churnCounter.ReplaceAllString(txt, "counter")
		txt = churnChainID.ReplaceAllString(txt, "<id>")
		txt = churnShard.ReplaceAllString(txt, "@endpoints$1-<shard>")
		var b strings.Builder
		b.WriteString(txt)
		for ri, r := range k.rules[c.Name] {
			set, els, _ := k.ruleEndpointElems(r)
			if set == "" {
				continue
			}
			f := portal.IPv4
			if strings.HasPrefix(set, "endpoints6") {
				f = portal.IPv6
			}
			if reached[set] == nil {
				reached[set] = map[string]bool{}
			}
			for _, el := range els {
				reached[set][string(el.Key)] = true
				ap, _ := decodeAddrPortVal(f, el.Val)
				fmt.Fprintf(&b, "\t\t# rule %d: %x -> %v\n", ri, el.Key[4:], ap)
			}
		}
		blocks = append(blocks, b.String())
	}
	orphans := 0
	for _, s := range k.sets {
		switch {
		case s.anonymous():
		case strings.HasPrefix(s.name, "endpoints"):
			for _, el := range k.elems[s.name] {
				if !reached[s.name][string(el.Key)] {
					orphans++
				}
			}
		case strings.HasPrefix(s.name, affinitySetPrefix):
			// The set's own timeout is the one it was created with: a new
			// timeout is in the rule that adds clients (compared with the
			// chains), and the set is kept with its clients.
			els, timeout := k.elems[s.name], s.timeout
			k.elems[s.name], s.timeout = nil, 0
			blocks = append(blocks, k.setText(s))
			k.elems[s.name], s.timeout = els, timeout
		default:
			blocks = append(blocks, k.setText(s))
		}
	}
	sort.Strings(blocks)
	return fmt.Sprintf("%s\n# endpoint-map elements no rule reaches: %d\n", strings.Join(blocks, "\n"), orphans)
}

// lineDiff lists the lines only in a (-) and only in b (+), at most 60.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			out = append(out, "- "+l)
			count[l]--
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] < 0 {
			out = append(out, "+ "+l)
			count[l]++
		}
	}
	if len(out) > 60 {
		out = append(out[:60], fmt.Sprintf("... and %d more lines", len(out)-60))
	}
	return strings.Join(out, "\n")
}

// readKernelOf reads b's table in the namespace netnsFD.
func readKernelOf(netnsFD int, b *Backend) (*kernelTable, error) { return readKernel(netnsFD, b.table) }
