package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

const vip = "10.96.0.10"

func web(eps ...int) *portal.Service {
	return svc("web", func(p *portal.Portal) {
		p.ClusterIPs = addrs(vip)
		for _, i := range eps {
			p.ClusterEndpoints = append(p.ClusterEndpoints, podEP(i))
		}
	})
}

// TestClusterIP: round robin over both pods, masquerade for clients outside
// the cluster network, the pod's own address kept for pods, UDP too, and a
// second full sync that finds nothing to change.
func TestClusterIP(t *testing.T) {
	n := newTestNet(t, 3)
	b := n.backend(testCfg)
	s := web(1, 2)
	udp := &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "dns", Protocol: portal.UDP, Family: portal.IPv4},
		Port: 53, ClusterIPs: addrs(vip), ClusterEndpoints: []netip.AddrPort{podUDP(1)}}
	s.Portals = append(s.Portals, udp)
	st := b.sync(true, s)
	t.Logf("first sync: %+v", st)

	seen := map[string]int{}
	for range 4 {
		pod, src := n.get(t, n.client, vip+":80")
		seen[pod]++
		if src == clientIP {
			t.Errorf("client outside the cluster network reached %s unmasqueraded (source %s)", pod, src)
		}
	}
	if seen["pod-1"] != 2 || seen["pod-2"] != 2 {
		t.Errorf("rr over 2 pods, 4 connections: %v", seen)
	}
	pod, src := n.get(t, n.pods[2], vip+":80")
	if src != podIP(3) {
		t.Errorf("pod 3 -> %s: source %s, want its own %s (no masquerade inside the cluster network)", pod, src, podIP(3))
	}
	if pod, _, err := n.udp(n.client, vip+":53"); err != nil || pod != "pod-1" {
		t.Errorf("udp: %q %v", pod, err)
	}

	// The kernel holds what the plan says, in the canonical form a full
	// sync compares with: nothing to change.
	if st := b.sync(true, s); st.Changed != 0 || st.Messages != 0 {
		t.Errorf("second full sync changed %d portals with %d messages; want none", st.Changed, st.Messages)
	}
	if st := b.sync(false, s); st.Messages != 0 {
		t.Errorf("incremental no-op sync sent %d messages", st.Messages)
	}
	if err := b.do(func(b *Backend) error { return b.Check(context.Background()) }); err != nil {
		t.Errorf("Check: %v", err)
	}
	d := b.dump()
	var raw strings.Builder
	_ = d.WriteTable(&raw)
	t.Logf("dump:\n%s\n%s", raw.String(), d.Raw)
	if len(d.Ports) != 2 || d.Ports[0].Service != "test/web:dns/udp/ipv4" || len(d.Ports[1].Endpoints) != 2 {
		t.Errorf("dump ports: %+v", d.Ports)
	}
	// IPVS folds its per-CPU counters into the totals every 2 s.
	for deadline := time.Now().Add(3 * time.Second); d.Ports[1].Packets == 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		d = b.dump()
	}
	if d.Ports[1].Packets == 0 || d.Ports[1].Endpoints[0].Packets == 0 {
		t.Errorf("no packets counted for %s: %+v", d.Ports[1].Service, d.Ports[1])
	}
}

// TestNodePort: a NodePort on the node's address reaches the pods,
// masqueraded (Cluster policy).
func TestNodePort(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	s.Portals[0].NodePort = 30080
	b.sync(true, s)
	seen := map[string]bool{}
	for range 4 {
		pod, src := n.get(t, n.client, nodeIP+":30080")
		seen[pod] = true
		if src == clientIP {
			t.Errorf("NodePort under the Cluster policy kept the client address")
		}
	}
	if len(seen) != 2 {
		t.Errorf("NodePort reached %v, want both pods", seen)
	}
}

// TestLocalPolicy: externalTrafficPolicy Local sends NodePort traffic to
// the local endpoint only and keeps the client's address; the cluster IP of
// the same port still uses every endpoint.
func TestLocalPolicy(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	p := s.Portals[0]
	p.NodePort, p.ExternalLocal = 30081, true
	p.LocalEndpoints = []netip.AddrPort{podEP(2)}
	b.sync(true, s)
	for range 3 {
		pod, src := n.get(t, n.client, nodeIP+":30081")
		if pod != "pod-2" || src != clientIP {
			t.Errorf("Local NodePort: reached %s seeing source %s; want pod-2 seeing %s", pod, src, clientIP)
		}
	}
	seen := map[string]bool{}
	for range 4 {
		pod, _ := n.get(t, n.client, vip+":80")
		seen[pod] = true
	}
	if len(seen) != 2 {
		t.Errorf("cluster IP under Local external policy reached %v, want both", seen)
	}
}

// TestRejectNoEndpoints: a Service port without endpoints refuses
// connections at once (ICMP port unreachable), for TCP and UDP.
func TestRejectNoEndpoints(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	s := web()
	s.Portals = append(s.Portals, &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "dns", Protocol: portal.UDP, Family: portal.IPv4},
		Port: 53, ClusterIPs: addrs(vip)})
	b.sync(true, s)
	start := time.Now()
	_, err := n.dial(n.client, vip+":80")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP without endpoints: %v, want connection refused", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("reject took %v", el)
	}
	if _, _, err := n.udp(n.client, vip+":53"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP without endpoints: %v, want connection refused", err)
	}
	d := b.dump()
	if len(d.Ports) != 2 || d.Ports[0].Note != noEndpointsNote {
		t.Errorf("dump: %+v", d.Ports)
	}
	b.sync(false, web(1))
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("after adding an endpoint: %s", pod)
	}
	// Deleting the Service removes its virtual servers and its VIP.
	b.remove(s.Key)
	if d := b.dump(); len(d.Ports) != 0 {
		t.Errorf("after deleting the Service: %+v\n%s", d.Ports, d.Raw)
	}
	var left []netip.Addr
	if err := b.do(func(b *Backend) (err error) { left, err = b.dummyAddrs(); return err }); err != nil || len(left) != 0 {
		t.Errorf("VIPs left on %s: %v %v", DummyInterface, left, err)
	}
}

// TestHairpin: a pod reaching itself through its Service is masqueraded,
// or it would answer itself directly and the connection would never open.
func TestHairpin(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	s := web(1)
	s.Portals[0].LocalEndpoints = []netip.AddrPort{podEP(1)}
	b.sync(true, s)
	pod, src := n.get(t, n.pods[0], vip+":80")
	if pod != "pod-1" || src == podIP(1) {
		t.Errorf("hairpin: reached %s seeing %s, want pod-1 seeing the node", pod, src)
	}
}

// TestIPv6: an IPv6 cluster IP and NodePort through ip6tables and IPVS,
// masqueraded for a client outside the cluster network, next to IPv4.
func TestIPv6(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	p6 := &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "http", Protocol: portal.TCP, Family: portal.IPv6}, Port: 80,
		ClusterIPs: addrs("fd00:96::10"), NodePort: 30090,
		ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("[" + podIP6(1) + "]:8080"), netip.MustParseAddrPort("[" + podIP6(2) + "]:8080")}}
	s.Portals = append(s.Portals, p6)
	b.sync(true, s)
	seen := map[string]bool{}
	for _, addr := range []string{"[fd00:96::10]:80", "[fd00:96::10]:80", "[" + nodeIP6 + "]:30090", "[" + nodeIP6 + "]:30090"} {
		pod, src := n.get(t, n.client, addr)
		seen[pod] = true
		if src == clientIP6 {
			t.Errorf("%s: IPv6 client outside the cluster network not masqueraded", addr)
		}
	}
	if len(seen) != 2 {
		t.Errorf("IPv6 reached %v, want both pods", seen)
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod == "" {
		t.Error("IPv4 next to IPv6")
	}
	if st := b.sync(true, s); st.Messages != 0 {
		t.Errorf("second full sync with IPv6 sent %d messages", st.Messages)
	}
}
