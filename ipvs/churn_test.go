package ipvs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

var (
	churnSeedFlag    = flag.Uint64("churn.seed", 0, "seed of TestChurn's mutations (default: $ONEHOP_CHURN_SEED, else time-based)")
	churnSecondsFlag = flag.Int("churn.seconds", 0, "how long TestChurn runs (default: $ONEHOP_CHURN_SECONDS, else 20)")
)

// TestChurn is a model-based test of the IPVS backend's syncs against the
// real kernel (it runs in the test VM: go test ./test/vm). A seeded
// generator applies random valid mutations to a model of the Services a
// node serves: types and ways in (cluster IPs, NodePorts, external and
// load-balancer IPs), ports and protocols, both families, traffic
// policies, affinity on, off and re-timed, the scheduler annotation, source
// ranges, endpoints ready, terminating, local and gone, addresses handed
// from one Service to another, Services deleted and re-created, and the
// node's NodePort addresses, under one of four backend configurations
// (churnConfigs, picked by the seed). Batches are synced incrementally
// with Dirty set; every few batches a full sync, and now and then a new
// Backend on the same kernel state and state file, as after an agent
// restart. After every
// batch:
//
//   - the sync did not fail, and Check passes;
//   - what the kernel holds (virtual servers and their live destinations,
//     the dummy's addresses, onehop's iptables rules of both families), read
//     back as a full sync reads it, equals the plan a full sync of the same
//     snapshot would apply; destinations at weight 0 are ones the backend is
//     draining;
//   - every way into every portal of the model is a virtual server with
//     the model's endpoints, scheduler and persistence;
//   - requests from a client outside the cluster to a few sampled ways in
//     reach an endpoint the model allows (seeing the client's address only
//     under the Local policy), are refused when there is none, and are
//     dropped when source ranges leave the client out.
//
// A failure names the seed and the batch: -churn.seed=N (or
// ONEHOP_CHURN_SEED=N) replays it. -churn.seconds or ONEHOP_CHURN_SECONDS
// sets how long it runs (default 20 s, and at least churnMinBatches
// batches), ONEHOP_CHURN_BATCH the average size of a large batch (default
// 25; a third of the batches are one to three mutations). The test VM
// passes the host's ONEHOP_CHURN_* through. The fixed cost of a batch
// (iptables commands, reading the kernel back, requests) bounds the
// mutation rate; larger batches reach more mutations a second.
func TestChurn(t *testing.T) {
	seed := *churnSeedFlag
	if seed == 0 {
		seed, _ = strconv.ParseUint(os.Getenv("ONEHOP_CHURN_SEED"), 10, 64)
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	seconds := *churnSecondsFlag
	if seconds == 0 {
		seconds, _ = strconv.Atoi(os.Getenv("ONEHOP_CHURN_SECONDS"))
	}
	if seconds <= 0 {
		seconds = 20
	}
	t.Logf("churn seed %d (replay: ONEHOP_CHURN_SEED=%d ONEHOP_VM_RUN=TestChurn go test ./test/vm, or -churn.seed=%d in the VM)", seed, seed, seed)

	n := newTestNet(t, churnPods)
	// IPVS refuses a connection without endpoints with ICMP port
	// unreachable, which the kernel rate-limits per client (a burst of 6,
	// then one a second): the probes would see timeouts instead.
	for _, kv := range [][2]string{{"net.ipv4.icmp_ratelimit", "0"}, {"net.ipv6.icmp.ratelimit", "0"}} {
		if err := nsutil.Sysctl(n.node, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(t.TempDir(), "state.json")
	opts := []Option{WithStateFile(state), WithDrainTimeout(3 * time.Second)}
	m := newChurnModel(seed)
	t.Logf("churn config: %s", m.cfgName)
	tb := n.backend(m.cfg, opts...)
	ctx := context.Background()

	var batches, mutations, fulls, restarts, probes, failed int
	var syncTime, checkTime, probeTime time.Duration
	start := time.Now()
	deadline := start.Add(time.Duration(seconds) * time.Second)
	batchSize := churnBatch
	if v, err := strconv.Atoi(os.Getenv("ONEHOP_CHURN_BATCH")); err == nil && v > 0 {
		batchSize = v
	}
	// At least churnMinBatches, however slow the machine: enough for full
	// syncs and a restart.
	for batch := 1; time.Now().Before(deadline) || batch <= churnMinBatches; batch++ {
		kind := "incremental"
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, batch %d (%s sync): %s\nmutations of this batch:\n\t%s\nreplay: ONEHOP_CHURN_SEED=%d ONEHOP_VM_RUN=TestChurn go test ./test/vm",
				seed, batch, kind, fmt.Sprintf(format, args...), strings.Join(m.log, "\n\t"), seed)
		}
		// A third of the batches are one to three mutations, so that
		// single changes are checked on their own.
		size := 1 + m.rng.IntN(2*batchSize)
		if m.rng.IntN(3) == 0 {
			size = 1 + m.rng.IntN(3)
		}
		for range size {
			m.mutate()
		}
		mutations += size
		snap := m.snapshot()
		full := batch%churnFullEvery == 0
		if batch%churnRestartEvery == 0 {
			old := tb.b
			if err := nsutil.Do(tb.ns, func() (err error) { tb.b, err = New(m.cfg, opts...); return err }); err != nil {
				fail("a new Backend: %v", err)
			}
			old.Close()
			full, kind = true, "restart's full"
			restarts++
		}
		if full {
			fulls++
			if kind == "incremental" {
				kind = "full"
			}
		}
		syncStart := time.Now()
		err := tb.do(func(b *Backend) error {
			st, err := b.Sync(ctx, snap, full)
			if err == nil && len(st.Panics) > 0 {
				err = fmt.Errorf("panics: %v", st.Panics)
			}
			return err
		})
		syncTime += time.Since(syncStart)
		if err != nil {
			failed++
			fail("sync of %d mutations failed: %v", size, err)
		}
		checkStart := time.Now()
		if err := tb.do(func(b *Backend) error { return b.Check(ctx) }); err != nil {
			fail("Check after the sync: %v", err)
		}
		if msg := m.compare(tb, snap); msg != "" {
			fail("%s", msg)
		}
		probeStart := time.Now()
		checkTime += probeStart.Sub(checkStart)
		for _, p := range m.probes(churnProbes) {
			probes++
			if msg := p.run(n); msg != "" {
				fail("%s", msg)
			}
		}
		probeTime += time.Since(probeStart)
		t.Logf("batch %d: %d mutations, %s sync %v, check %v, requests %v", batch, size, kind,
			checkStart.Sub(syncStart).Round(time.Millisecond), probeStart.Sub(checkStart).Round(time.Millisecond), time.Since(probeStart).Round(time.Millisecond))
		batches++
		m.log = m.log[:0]
	}
	elapsed := time.Since(start)
	t.Logf("churn: time in syncs %v, reading back and comparing %v, requests %v",
		syncTime.Round(time.Millisecond), checkTime.Round(time.Millisecond), probeTime.Round(time.Millisecond))
	t.Logf("churn: %d mutations in %d batches (%d full syncs, %d restarts), %d failed syncs, checked in %v: %.1f mutations/s overall, %.0f mutations/s of sync time; %d requests; %d Services at the end",
		mutations, batches, fulls, restarts, failed, elapsed.Round(time.Millisecond), float64(mutations)/elapsed.Seconds(),
		float64(mutations)/syncTime.Seconds(), probes, len(m.svcs))
}

// Sizes of TestChurn.
const (
	churnPods         = 3
	churnMaxServices  = 24
	churnBatch        = 25 // mutations in a large batch, on average (ONEHOP_CHURN_BATCH)
	churnMinBatches   = 6
	churnFullEvery    = 3
	churnRestartEvery = 5
	churnProbes       = 3 // requests per batch
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

// kernelState reads back what the backend owns, as a full sync reads it,
// from every family whose iptables exists.
func kernelState(b *Backend) (*plan, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	have, err := b.readKernel()
	if err != nil {
		return nil, err
	}
	for fam, t := range b.ipt {
		tables, err := t.tablesNow()
		if err != nil {
			return nil, err
		}
		readRules(fam, have, tables)
	}
	return have, nil
}

// compare checks the kernel against a full plan of the snapshot and
// against the model's ways in.
func (m *churnModel) compare(tb *backend, snap *portal.Snapshot) string {
	var have *plan
	var draining []string
	var sched string
	var pending map[string]bool
	if err := tb.do(func(b *Backend) (err error) {
		if have, err = kernelState(b); err != nil {
			return err
		}
		draining = b.Draining()
		b.mu.Lock()
		defer b.mu.Unlock()
		sched = b.sched
		if b.sets != nil {
			pending = maps.Clone(b.sets.pending)
		}
		return nil
	}); err != nil {
		return fmt.Sprintf("reading the kernel back: %v", err)
	}
	var nodeAddrs []netip.Addr
	nodeAddrs = append(nodeAddrs, snap.Node.NodePortAddrs...)
	want := buildPlan(planInput{Cfg: m.cfg, Sched: sched, NodeAddrs: nodeAddrs}, snap.Services)
	if len(want.Conflicts) > 0 {
		return fmt.Sprintf("the model made conflicting Services: %v", want.Conflicts)
	}
	var diffs []string
	for k, v := range want.Servers {
		h := have.Servers[k]
		if h == nil {
			diffs = append(diffs, fmt.Sprintf("missing virtual server %s (%s)", k, v.Portal))
			continue
		}
		if !h.sameService(v) {
			diffs = append(diffs, fmt.Sprintf("%s: scheduler %s timeout %d, want %s %d", k, h.Sched, h.Timeout, v.Sched, v.Timeout))
		}
		for d, w := range h.Dests {
			switch _, ok := v.Dests[d]; {
			case w == 0 && !slices.Contains(draining, k.String()+" -> "+d.String()):
				diffs = append(diffs, fmt.Sprintf("%s: %s at weight 0 but not draining", k, d))
			case w == 0 && ok:
				diffs = append(diffs, fmt.Sprintf("%s: endpoint %s at weight 0", k, d))
			case w != 0 && !ok:
				diffs = append(diffs, fmt.Sprintf("%s: stale destination %s", k, d))
			}
		}
		for d := range v.Dests {
			if _, ok := h.Dests[d]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: missing destination %s", k, d))
			}
		}
	}
	for k := range have.Servers {
		if want.Servers[k] == nil {
			diffs = append(diffs, fmt.Sprintf("stale virtual server %s", k))
		}
	}
	for a := range want.VIPs {
		if !have.VIPs[a] {
			diffs = append(diffs, fmt.Sprintf("VIP %s not on %s", a, DummyInterface))
		}
	}
	for a := range have.VIPs {
		if !want.VIPs[a] {
			diffs = append(diffs, fmt.Sprintf("stale VIP %s", a))
		}
	}
	for k := range want.Rules {
		if _, ok := have.Rules[k]; !ok {
			diffs = append(diffs, "missing rule "+k)
		}
	}
	for k := range have.Rules {
		if _, ok := want.Rules[k]; !ok {
			diffs = append(diffs, "stale rule "+k)
		}
	}
	for name := range pending {
		if _, ok := want.Sets[name]; ok {
			diffs = append(diffs, fmt.Sprintf("wanted ipset %s is waiting to be destroyed", name))
		}
	}
	if w, h := churnSetLines(want, nil), churnSetLines(have, pending); w != h {
		diffs = append(diffs, fmt.Sprintf("source ranges differ:\nkernel:\n%s\nwant:\n%s", h, w))
	}
	// The model's ways in, independently of the plan.
	for _, w := range m.ways() {
		h := have.Servers[w.key]
		if h == nil {
			diffs = append(diffs, fmt.Sprintf("model: no virtual server for %s of %v", w.key, w.svc.key))
			continue
		}
		var live []netip.AddrPort
		for d, wt := range h.Dests {
			if wt > 0 {
				live = append(live, d)
			}
		}
		slices.SortFunc(live, netip.AddrPort.Compare)
		wantSched := cmpOr(w.svc.sched, sched)
		if !slices.Equal(live, w.eps) || h.Sched != wantSched || h.Timeout != w.svc.affinity {
			diffs = append(diffs, fmt.Sprintf("model: %s of %v holds %v %s %d, want %v %s %d", w.key, w.svc.key, live, h.Sched, h.Timeout, w.eps, wantSched, w.svc.affinity))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	slices.Sort(diffs)
	return fmt.Sprintf("the kernel differs from a full plan of the same snapshot and from the model:\n\t%s", strings.Join(diffs, "\n\t"))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// churnSetLines renders the source-range sets of a plan for comparison,
// leaving out the ones waiting to be destroyed.
func churnSetLines(pl *plan, pending map[string]bool) string {
	var lines []string
	for name, c := range pl.Sets {
		if !pending[name] {
			lines = append(lines, fmt.Sprintf("%s %s %v", c.Family, name, c.Nets))
		}
	}
	for name := range pl.SRChains {
		lines = append(lines, "chain "+name)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// churnProbe is one request from the client through a way in.
type churnProbe struct {
	w       way
	addr    string
	allowed map[string]bool // pod names that may answer
	denied  bool            // source ranges leave the client out: dropped
	// keepSource: the pod must see the client's address; else the node's.
	keepSource bool
}

func podName(d netip.AddrPort) string {
	for i := 1; i <= churnPods; i++ {
		if d.Addr() == churnEPAddr(portal.FamilyOf(d.Addr()), i) {
			return fmt.Sprintf("pod-%d", i)
		}
	}
	return d.String()
}

// probes picks n ways in at random. Dropped ones are sampled less: each
// costs a timeout.
func (m *churnModel) probes(n int) []churnProbe {
	ways := m.ways()
	var out []churnProbe
	for range n * 3 {
		if len(out) == n || len(ways) == 0 {
			break
		}
		w := ways[m.rng.IntN(len(ways))]
		client := netip.MustParseAddr(clientIP)
		if w.key.family() == portal.IPv6 {
			client = netip.MustParseAddr(clientIP6)
		}
		p := churnProbe{w: w, addr: netip.AddrPortFrom(w.key.Addr, w.key.Port).String(), allowed: map[string]bool{}}
		if w.lb || (w.nodePort && w.svc.lb && m.cfg.SourceRangesOnNodePorts) {
			rs := ofFamily(w.svc.ranges, w.key.family())
			p.denied = len(rs) > 0 && !slices.ContainsFunc(rs, func(r netip.Prefix) bool { return r.Contains(client) })
		}
		if p.denied && m.rng.IntN(4) != 0 {
			continue
		}
		for _, d := range w.eps {
			p.allowed[podName(d)] = true
		}
		// The pod sees the client under the Local policy, and on cluster
		// IPs when nothing masquerades by default.
		p.keepSource = (w.external && w.svc.extLocal) ||
			(!w.external && len(m.cfg.ClusterCIDRs) == 0 && !m.cfg.MasqueradeAll)
		out = append(out, p)
	}
	return out
}

func (p churnProbe) run(n *testNet) string {
	what := fmt.Sprintf("%s %s (%v, endpoints %v)", p.w.key.Proto, p.addr, p.w.svc.key, p.w.eps)
	var pod, src string
	var err error
	if p.w.key.Proto == portal.UDP {
		pod, src, err = n.udp(n.client, p.addr)
	} else {
		var c *conn
		if c, err = n.dial(n.client, p.addr); err == nil {
			c.Close()
			pod, src = c.Pod, c.Source
		}
	}
	switch {
	case p.denied:
		if err == nil {
			return fmt.Sprintf("%s: answered by %s, but the source ranges leave the client out", what, pod)
		}
	case len(p.allowed) == 0:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Sprintf("%s: no endpoints, want connection refused, got %q %v", what, pod, err)
		}
	case err != nil:
		return fmt.Sprintf("%s: %v", what, err)
	case !p.allowed[pod]:
		return fmt.Sprintf("%s: answered by %s, not an endpoint", what, pod)
	case p.keepSource:
		if src != clientIP && src != clientIP6 {
			return fmt.Sprintf("%s: the pod saw %s instead of the client (Local policy, or nothing to masquerade)", what, src)
		}
	case src == clientIP || src == clientIP6:
		return fmt.Sprintf("%s: the pod saw the client's address, not masqueraded", what)
	}
	return ""
}
