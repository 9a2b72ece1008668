package portal

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// lbWithRanges is a dual-stack LoadBalancer Service with a VIP of each
// family and the given loadBalancerSourceRanges.
func lbWithRanges(ranges ...string) *v1.Service {
	return svc(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.LoadBalancerSourceRanges = ranges
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.7"}, {IP: "203.0.113.9"}, {IP: "2001:db8::7"}}
	})
}

// rangesOf returns the source ranges of each family's portal.
func rangesOf(t *testing.T, s *Service) map[Family]string {
	t.Helper()
	out := map[Family]string{}
	for _, p := range s.Portals {
		out[p.Key.Family] = fmt.Sprint(p.SourceRanges)
	}
	return out
}

// TestSourceRangesLetTheNodeLoopBack: when a range holds the node's
// address of a family, the Service's load-balancer IPs of that family are
// allowed too, as kube-proxy allows them (a node's connection to a VIP
// local to it loops back from the VIP); a family whose ranges leave the
// node out gets nothing more, nor does any family when the node's address
// is unknown.
func TestSourceRangesLetTheNodeLoopBack(t *testing.T) {
	for _, c := range []struct {
		name    string
		nodeIPs []string
		ranges  []string
		want    map[Family]string
	}{
		{"node inside the IPv4 range", []string{"192.0.2.11", "2001:db8:1::11"}, []string{"192.0.2.0/24", "2001:db8:2::/64"},
			map[Family]string{IPv4: "[192.0.2.0/24 203.0.113.7/32 203.0.113.9/32]", IPv6: "[2001:db8:2::/64]"}},
		{"node inside both", []string{"192.0.2.11", "2001:db8:1::11"}, []string{"192.0.2.11/32", "2001:db8:1::/64"},
			map[Family]string{IPv4: "[192.0.2.11/32 203.0.113.7/32 203.0.113.9/32]", IPv6: "[2001:db8::7/128 2001:db8:1::/64]"}},
		{"a VIP inside a range already", []string{"192.0.2.11"}, []string{"192.0.2.0/24", "203.0.113.7/32"},
			map[Family]string{IPv4: "[192.0.2.0/24 203.0.113.7/32 203.0.113.9/32]", IPv6: "[]"}},
		{"node outside", []string{"192.0.2.11"}, []string{"198.51.100.0/24"},
			map[Family]string{IPv4: "[198.51.100.0/24]", IPv6: "[]"}},
		{"node unknown", nil, []string{"0.0.0.0/0"},
			map[Family]string{IPv4: "[0.0.0.0/0]", IPv6: "[]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := buildTestConfig()
			for _, a := range c.nodeIPs {
				cfg.NodeIPs = append(cfg.NodeIPs, netip.MustParseAddr(a))
			}
			s, _ := cfg.Build(lbWithRanges(c.ranges...), nil)
			if got := rangesOf(t, s); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("source ranges %v, want %v", got, c.want)
			}
		})
	}
}

// TestTrackerRebuildsSourceRangesWhenTheNodeMoves: the Node's primary
// address comes from its object; when it enters or leaves a Service's
// ranges, the Service is rebuilt.
func TestTrackerRebuildsSourceRangesWhenTheNodeMoves(t *testing.T) {
	tr := NewTracker(Config{NodeName: "n1"}, nil, nil)
	tr.SetService(lbWithRanges("192.0.2.0/24"))
	tr.SetService(svc(func(s *v1.Service) { s.Name = "plain"; s.Spec.ClusterIPs = []string{"10.96.0.11"} }))
	tr.SetSlice(slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"}))
	node := func(ip string) *v1.Node {
		return &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}}}
	}
	tr.SetNode(node("198.51.100.5"))
	snap, _ := tr.Snapshot()
	web := ServiceKey{"ns", "web"}
	if got := rangesOf(t, snap.Services[web])[IPv4]; got != "[192.0.2.0/24]" {
		t.Fatalf("node outside the ranges: %s", got)
	}
	tr.SetNode(node("192.0.2.11"))
	snap, _ = tr.Snapshot()
	if fmt.Sprint(snap.Dirty) != fmt.Sprint([]ServiceKey{web}) {
		t.Errorf("dirty %v, want only %v", snap.Dirty, web)
	}
	if got := rangesOf(t, snap.Services[web])[IPv4]; got != "[192.0.2.0/24 203.0.113.7/32 203.0.113.9/32]" {
		t.Errorf("node inside the ranges: %s", got)
	}
}
