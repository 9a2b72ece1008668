package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/portal"
)

// Unit tests of the stale-entry rules on synthetic flows; the real kernel
// test is in test/conntrack.

const (
	vip      = "10.96.0.10"
	extVIP   = "203.0.113.7"
	nodeAddr = "192.0.2.11"
	client   = "198.51.100.10"
)

// udpService is one Service with a UDP port 53 (and NodePort 30053) and the
// given endpoint IPs on port 5353.
func udpService(name string, proto portal.Protocol, eps ...string) *portal.Service {
	key := portal.ServiceKey{Namespace: "default", Name: name}
	p := &portal.Portal{
		Key:         portal.PortKey{Service: key, Port: "dns", Protocol: proto, Family: portal.IPv4},
		Port:        53,
		ClusterIPs:  []netip.Addr{netip.MustParseAddr(vip)},
		ExternalIPs: []netip.Addr{netip.MustParseAddr(extVIP)},
		NodePort:    30053,
	}
	for _, ep := range eps {
		p.ClusterEndpoints = append(p.ClusterEndpoints, netip.AddrPortFrom(netip.MustParseAddr(ep), 5353))
	}
	return &portal.Service{Key: key, Portals: []*portal.Portal{p}}
}

func ctSnap(svcs ...*portal.Service) *portal.Snapshot {
	s := snapOf(svcs...)
	s.Node.NodePortAddrs = []netip.Addr{netip.MustParseAddr(nodeAddr)}
	return s
}

// flow is a conntrack entry: client:40000 -> dst:dport, answered by
// replySrc:replyPort (dst:dport itself when not DNATed).
func flow(proto uint8, dst string, dport uint16, replySrc string, replyPort uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(client), SrcPort: 40000, DstIP: net.ParseIP(dst), DstPort: dport},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc), SrcPort: replyPort, DstIP: net.ParseIP(client), DstPort: 40000},
	}
}

func notNATed(proto uint8, dst string, dport uint16) *netlink.ConntrackFlow {
	return flow(proto, dst, dport, dst, dport)
}

// inState gives a TCP flow its conntrack state.
func inState(f *netlink.ConntrackFlow, state uint8) *netlink.ConntrackFlow {
	f.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
	return f
}

const tcpEstablished = 3

func TestConntrackTCPOnlyHalfOpen(t *testing.T) {
	before := udpService("web", portal.TCP, "10.244.1.10", "10.244.2.10")
	f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap(udpService("web", portal.TCP, "10.244.2.10")))
	checkFlows(t, f, []flowCase{
		{"SYN_SENT to the gone endpoint", inState(flow(tcp, vip, 53, "10.244.1.10", 5353), tcpSynSent), true},
		{"SYN_SENT2 to the gone endpoint", inState(flow(tcp, vip, 53, "10.244.1.10", 5353), tcpSynSent2), true},
		{"SYN_SENT via the NodePort to the gone endpoint", inState(flow(tcp, nodeAddr, 30053, "10.244.1.10", 5353), tcpSynSent), true},
		{"established to the gone endpoint (left to finish)", inState(flow(tcp, vip, 53, "10.244.1.10", 5353), tcpEstablished), false},
		{"SYN_SENT to the remaining endpoint", inState(flow(tcp, vip, 53, "10.244.2.10", 5353), tcpSynSent), false},
		{"no state decoded", flow(tcp, vip, 53, "10.244.1.10", 5353), false},
	})

	// Created, or served again after having no endpoints: half-open
	// flows that were not DNATed go.
	f, _ = planConntrack(nil, ctSnap(udpService("web", portal.TCP, "10.244.2.10")))
	checkFlows(t, f, []flowCase{
		{"SYN_SENT not DNATed", inState(notNATed(tcp, extVIP, 53), tcpSynSent), true},
		{"SYN_SENT to a NodePort, not DNATed", inState(notNATed(tcp, nodeAddr, 30053), tcpSynSent), true},
		{"established, not DNATed", inState(notNATed(tcp, extVIP, 53), tcpEstablished), false},
		{"SYN_SENT to an endpoint that is not the Service's (left from before a start)", inState(flow(tcp, vip, 53, "10.244.9.9", 5353), tcpSynSent), true},
	})
}

type flowCase struct {
	name  string
	flow  *netlink.ConntrackFlow
	stale bool
}

func checkFlows(t *testing.T, f *conntrackFilter, cases []flowCase) {
	t.Helper()
	for _, c := range cases {
		if got := f.MatchConntrackFlow(c.flow); got != c.stale {
			t.Errorf("%s: stale = %v, want %v", c.name, got, c.stale)
		}
	}
}

const udp, tcp, sctp = uint8(portal.UDP), uint8(portal.TCP), uint8(portal.SCTP)

func TestConntrackEndpointGone(t *testing.T) {
	prev := map[portal.ServiceKey]*portal.Service{}
	before := udpService("dns", portal.UDP, "10.244.1.10", "10.244.2.10")
	prev[before.Key] = before
	f, changes := planConntrack(prev, ctSnap(udpService("dns", portal.UDP, "10.244.2.10")))
	if len(changes) != 1 || changes[0].svc == nil {
		t.Fatalf("changes %+v, want the new dns to remember", changes)
	}
	checkFlows(t, f, []flowCase{
		{"cluster IP DNATed to the gone endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), true},
		{"external IP DNATed to the gone endpoint", flow(udp, extVIP, 53, "10.244.1.10", 5353), true},
		{"NodePort DNATed to the gone endpoint", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), true},
		{"cluster IP DNATed to the remaining endpoint", flow(udp, vip, 53, "10.244.2.10", 5353), false},
		{"NodePort DNATed to the remaining endpoint", flow(udp, nodeAddr, 30053, "10.244.2.10", 5353), false},
		{"TCP to the cluster IP", flow(tcp, vip, 53, "10.244.1.10", 5353), false},
		{"another port of the cluster IP", flow(udp, vip, 54, "10.244.1.10", 5353), false},
		{"NodePort number on an address NodePorts are not served on", flow(udp, "10.0.0.1", 30053, "10.244.1.10", 5353), false},
		{"unrelated flow to the pod", flow(udp, "10.244.1.10", 5353, "10.244.1.10", 5353), false},
	})
}

func TestConntrackNoChangeNoWork(t *testing.T) {
	svc := udpService("dns", portal.UDP, "10.244.1.10")
	tcpSvc := udpService("web", portal.TCP, "10.244.1.10")
	prev := map[portal.ServiceKey]*portal.Service{svc.Key: svc, tcpSvc.Key: tcpSvc}
	f, changes := planConntrack(prev, ctSnap(svc, tcpSvc))
	if !f.empty() {
		t.Errorf("unchanged UDP and TCP Services gave work: %+v", f)
	}
	if len(changes) != 0 {
		t.Errorf("changes %+v, want none (unchanged Services)", changes)
	}
	// Apply needs no netlink socket when nothing is stale (and this one,
	// in the test's own namespace, must not touch it).
	c := NewConntrackCleaner(nil, -1)
	c.prev = map[portal.ServiceKey]*portal.Service{svc.Key: svc, tcpSvc.Key: tcpSvc}
	if n, err := c.Apply(ctSnap(svc, tcpSvc)); n != 0 || err != nil {
		t.Errorf("Apply with nothing to clean: %d, %v", n, err)
	}
	if c.handle != nil || len(c.prev) != 2 || c.prev[svc.Key] != svc {
		t.Errorf("after Apply: handle %v, remembered %v; want no socket and both Services", c.handle, c.prev)
	}
	// A new endpoint next to a kept one leaves nothing stale.
	f, _ = planConntrack(prev, ctSnap(udpService("dns", portal.UDP, "10.244.1.10", "10.244.2.10"), tcpSvc))
	if !f.empty() {
		t.Errorf("an added endpoint gave work: %+v", f)
	}
}

func TestConntrackFromNoEndpoints(t *testing.T) {
	empty := udpService("dns", portal.UDP)
	for name, prev := range map[string]map[portal.ServiceKey]*portal.Service{
		"scale 0 -> 1":           {empty.Key: empty},
		"created":                {},
		"first sync after start": nil,
	} {
		t.Run(name, func(t *testing.T) {
			f, _ := planConntrack(prev, ctSnap(udpService("dns", portal.UDP, "10.244.1.10")))
			checkFlows(t, f, []flowCase{
				{"cluster IP not DNATed", notNATed(udp, vip, 53), true},
				{"external IP not DNATed", notNATed(udp, extVIP, 53), true},
				{"NodePort not DNATed", notNATed(udp, nodeAddr, 30053), true},
				{"cluster IP DNATed to the endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), false},
				{"TCP not DNATed", notNATed(tcp, vip, 53), false},
			})
		})
	}
}

func TestConntrackToNoEndpoints(t *testing.T) {
	before := udpService("dns", portal.UDP, "10.244.1.10")
	f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap(udpService("dns", portal.UDP)))
	checkFlows(t, f, []flowCase{
		{"DNATed to the gone endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), true},
		{"not DNATed while no endpoint exists", notNATed(udp, vip, 53), false},
	})
}

func TestConntrackServiceDeletedAndAddressRemoved(t *testing.T) {
	before := udpService("dns", portal.UDP, "10.244.1.10")
	f, changes := planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap())
	if len(changes) != 1 || changes[0].svc != nil {
		t.Errorf("changes %+v, want the deleted Service forgotten", changes)
	}
	checkFlows(t, f, []flowCase{
		{"cluster IP DNATed after delete", flow(udp, vip, 53, "10.244.1.10", 5353), true},
		{"NodePort DNATed after delete", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), true},
		{"not DNATed after delete", notNATed(udp, vip, 53), false},
	})

	// The external IP and the NodePort are removed; the endpoint stays.
	after := udpService("dns", portal.UDP, "10.244.1.10")
	after.Portals[0].ExternalIPs = nil
	after.Portals[0].NodePort = 0
	f, _ = planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap(after))
	checkFlows(t, f, []flowCase{
		{"removed external IP, DNATed", flow(udp, extVIP, 53, "10.244.1.10", 5353), true},
		{"removed NodePort, DNATed", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), true},
		{"kept cluster IP, DNATed to the kept endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), false},
	})
}

func TestConntrackLocalEndpointsCount(t *testing.T) {
	// externalTrafficPolicy Local: external flows go to local endpoints,
	// which stay valid DNAT targets.
	before := udpService("dns", portal.UDP, "10.244.1.10", "10.244.2.10")
	after := udpService("dns", portal.UDP, "10.244.2.10")
	after.Portals[0].LocalEndpoints = []netip.AddrPort{netip.MustParseAddrPort("10.244.3.10:5353")}
	f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap(after))
	checkFlows(t, f, []flowCase{
		{"NodePort DNATed to a local endpoint", flow(udp, nodeAddr, 30053, "10.244.3.10", 5353), false},
		{"NodePort DNATed to the gone endpoint", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), true},
	})
}

func TestConntrackSCTPByAddress(t *testing.T) {
	before := udpService("assoc", portal.SCTP, "10.244.1.10", "10.244.2.10")
	f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{before.Key: before}, ctSnap(udpService("assoc", portal.SCTP, "10.244.2.10")))
	// The library leaves SCTP ports at 0.
	checkFlows(t, f, []flowCase{
		{"SCTP DNATed to the gone endpoint", flow(sctp, vip, 0, "10.244.1.10", 0), true},
		{"SCTP DNATed to the remaining endpoint", flow(sctp, vip, 0, "10.244.2.10", 0), false},
		{"SCTP to the NodePort address (not decoded)", flow(sctp, nodeAddr, 0, "10.244.1.10", 0), false},
		{"UDP to the cluster IP", flow(udp, vip, 53, "10.244.1.10", 5353), false},
	})
}

func TestConntrackIPv6Family(t *testing.T) {
	key := portal.ServiceKey{Namespace: "default", Name: "v6"}
	mk := func(eps ...string) *portal.Service {
		p := &portal.Portal{Key: portal.PortKey{Service: key, Protocol: portal.UDP, Family: portal.IPv6}, Port: 53,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::10")}}
		for _, ep := range eps {
			p.ClusterEndpoints = append(p.ClusterEndpoints, netip.AddrPortFrom(netip.MustParseAddr(ep), 5353))
		}
		return &portal.Service{Key: key, Portals: []*portal.Portal{p}}
	}
	before := mk("fd00:244:1::10")
	f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{key: before}, ctSnap(mk("fd00:244:2::10")))
	if fams := f.families(); len(fams) != 1 || fams[0] != 10 /* AF_INET6 */ {
		t.Errorf("families %v, want only AF_INET6", fams)
	}
	checkFlows(t, f, []flowCase{
		{"v6 DNATed to the gone endpoint", flow(udp, "fd00:96::10", 53, "fd00:244:1::10", 5353), true},
		{"v6 DNATed to the new endpoint", flow(udp, "fd00:96::10", 53, "fd00:244:2::10", 5353), false},
	})
}

// Changes batched into one walk: every version the kernel had since the
// last walk counts, not only the first and the last. A Service that got an
// endpoint and lost it (deleted, scaled to zero) within the interval left
// flows DNATed to that endpoint; one that had none for a moment left flows
// recorded un-NATed.
func TestConntrackBatchCountsEveryVersion(t *testing.T) {
	empty := udpService("dns", portal.UDP)
	served := udpService("dns", portal.UDP, "10.244.1.10")
	key := served.Key
	plan := func(prev *portal.Service, versions ...*portal.Service) (*conntrackFilter, []ctChange) {
		remembered := map[portal.ServiceKey]*portal.Service{}
		if prev != nil {
			remembered[key] = prev
		}
		return planChanges(remembered, map[portal.ServiceKey][]*portal.Service{key: versions},
			[]netip.Addr{netip.MustParseAddr(nodeAddr)}, func(func(*portal.Service) bool) {})
	}
	dnated := []flowCase{
		{"cluster IP DNATed to the short-lived endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), true},
		{"NodePort DNATed to the short-lived endpoint", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), true},
		{"external IP DNATed to the short-lived endpoint", flow(udp, extVIP, 53, "10.244.1.10", 5353), true},
	}

	for _, tc := range []struct {
		name     string
		prev     *portal.Service
		versions []*portal.Service
	}{
		{"created with an endpoint, then deleted", nil, []*portal.Service{served, nil}},
		{"created without, got an endpoint, then deleted", nil, []*portal.Service{empty, served, nil}},
		{"got an endpoint, then scaled to zero", empty, []*portal.Service{served, udpService("dns", portal.UDP)}},
		{"created with an endpoint, then scaled to zero", nil, []*portal.Service{served, udpService("dns", portal.UDP)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, changes := plan(tc.prev, tc.versions...)
			if cur := tc.versions[len(tc.versions)-1]; len(changes) != 1 || changes[0].svc != cur {
				t.Fatalf("changes %+v, want the last version remembered", changes)
			}
			checkFlows(t, f, dnated)
		})
	}

	t.Run("served, none for a moment, served again", func(t *testing.T) {
		f, _ := plan(served, udpService("dns", portal.UDP), udpService("dns", portal.UDP, "10.244.1.10"))
		checkFlows(t, f, []flowCase{
			{"cluster IP, recorded un-NATed while rejected", notNATed(udp, vip, 53), true},
			{"NodePort, recorded un-NATed while rejected", notNATed(udp, nodeAddr, 30053), true},
			{"cluster IP DNATed to the endpoint", flow(udp, vip, 53, "10.244.1.10", 5353), false},
		})
	})

	t.Run("an endpoint that came and went while another stayed", func(t *testing.T) {
		f, _ := plan(served, udpService("dns", portal.UDP, "10.244.1.10", "10.244.2.10"), served)
		checkFlows(t, f, []flowCase{
			{"DNATed to the endpoint that went", flow(udp, vip, 53, "10.244.2.10", 5353), true},
			{"DNATed to the endpoint that stayed", flow(udp, vip, 53, "10.244.1.10", 5353), false},
		})
	})

	t.Run("an address and a NodePort that came and went", func(t *testing.T) {
		moved := udpService("dns", portal.UDP, "10.244.1.10")
		moved.Portals[0].ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.99")}
		moved.Portals[0].NodePort = 30099
		f, _ := plan(served, moved, udpService("dns", portal.UDP, "10.244.1.10"))
		checkFlows(t, f, []flowCase{
			{"through the address that went", flow(udp, "203.0.113.99", 53, "10.244.1.10", 5353), true},
			{"through the NodePort that went", flow(udp, nodeAddr, 30099, "10.244.1.10", 5353), true},
			{"through the address that stayed", flow(udp, extVIP, 53, "10.244.1.10", 5353), false},
			{"through the NodePort that stayed", flow(udp, nodeAddr, 30053, "10.244.1.10", 5353), false},
		})
	})

	t.Run("back to the remembered version", func(t *testing.T) {
		f, changes := plan(served, served)
		if !f.empty() || len(changes) != 0 {
			t.Errorf("no change: filter %+v, changes %+v; want nothing to do", f, changes)
		}
	})
}

// BenchmarkConntrackPlan10k is the cost the cleaner adds to a sync of 10k
// Services (half of them UDP) when one UDP Service lost an endpoint.
func BenchmarkConntrackPlan10k(b *testing.B) {
	snap := ctSnap()
	prev := map[portal.ServiceKey]*portal.Service{}
	for i := range 10000 {
		proto := portal.UDP
		if i%2 == 1 {
			proto = portal.TCP
		}
		svc := udpService(fmt.Sprintf("svc-%d", i), proto, "10.244.1.10", "10.244.2.10")
		snap.Services[svc.Key] = svc
		prev[svc.Key] = svc
	}
	changed := udpService("svc-0", portal.UDP, "10.244.2.10")
	snap.Services[changed.Key] = changed
	b.ReportAllocs()
	for b.Loop() {
		f, changes := planConntrack(prev, snap)
		if f.empty() || len(changes) != 1 {
			b.Fatal("want one change")
		}
	}
}

// OnApplied walks the conntrack table at most once per MinInterval: a
// change in a quiet time at once, a burst of changes in one walk when the
// interval is over; and it looks at the snapshot's Dirty Services only.
func TestConntrackOnAppliedBatchesWalks(t *testing.T) {
	ns := newTestNS(t)
	c := NewConntrackCleaner(nil, ns.FD())
	defer c.Close()
	c.MinInterval = 300 * time.Millisecond
	state := func() (walks, pending int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.walks, len(c.pending)
	}
	dirty := func(s *portal.Snapshot, svcs ...*portal.Service) *portal.Snapshot {
		s.Dirty = nil
		for _, svc := range svcs {
			s.Dirty = append(s.Dirty, svc.Key)
		}
		return s
	}

	a := udpService("a", portal.UDP, "10.244.1.10", "10.244.2.10")
	c.OnApplied(ctSnap(a)) // the first call takes the whole snapshot: a is new
	if w, p := state(); w != 1 || p != 0 {
		t.Fatalf("first change in a quiet time: %d walks, %d pending; want 1 walk at once", w, p)
	}

	a2 := udpService("a", portal.UDP, "10.244.2.10") // lost an endpoint
	b := udpService("b", portal.UDP, "10.244.3.10")
	c.OnApplied(dirty(ctSnap(a2), a2))
	c.OnApplied(dirty(ctSnap(a2, b), b))
	if w, p := state(); w != 1 || p != 2 {
		t.Fatalf("a burst within the interval: %d walks, %d pending; want both changes to wait", w, p)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if w, p := state(); p == 0 {
			if w != 2 {
				t.Fatalf("the burst took %d walks, want 1", w-1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the burst was not cleaned after the interval")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	if c.prev[a2.Key] != a2 || c.prev[b.Key] != b {
		t.Errorf("after the burst the cleaner remembers %v, want the latest a and b", c.prev)
	}
	c.mu.Unlock()

	// Only Dirty counts: a Service changed but not listed is not looked at.
	a3 := udpService("a", portal.UDP)
	c.OnApplied(dirty(ctSnap(a3, b)))
	if w, p := state(); w != 2 || p != 0 {
		t.Errorf("a snapshot with nothing dirty: %d walks, %d pending; want no work", w, p)
	}
}
