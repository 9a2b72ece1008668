package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// A dual-stack Service: one portal per family, in one inet table.
func TestDualStack(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	key := portal.ServiceKey{Namespace: "default", Name: "ds"}
	v6VIP := netip.MustParseAddr("fd00:96::10")
	v6Ext := netip.MustParseAddr("2001:db8:99::10")
	svc := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP} {
		svc.Portals = append(svc.Portals,
			&portal.Portal{Key: portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv4}, Port: 80,
				ClusterIPs: []netip.Addr{clusterIP}, NodePort: 30080, ClusterEndpoints: eps(8080, 1, 2)},
			&portal.Portal{Key: portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv6}, Port: 80,
				ClusterIPs: []netip.Addr{v6VIP}, NodePort: 30080, ExternalIPs: []netip.Addr{v6Ext},
				ClusterEndpoints: []netip.AddrPort{netip.AddrPortFrom(podIP6(1), 8080), netip.AddrPortFrom(podIP6(2), 8080)}})
	}
	tp.sync(t, snapshot(svc), true)
	for _, network := range []string{"tcp", "udp"} {
		if seen, src := ask(t, tp.pods[0], network, "[fd00:96::10]:80", 30); len(seen) != 2 || !strings.Contains(src, podIP6(0).String()) {
			t.Errorf("%s IPv6 cluster IP from a pod: %v, source %s", network, seen, src)
		}
		if seen, _ := ask(t, tp.client, network, "["+nodeIP6+"]:30080", 20); len(seen) != 2 {
			t.Errorf("%s IPv6 NodePort: %v", network, seen)
		}
		if seen, _ := ask(t, tp.client, network, "[2001:db8:99::10]:80", 20); len(seen) != 2 {
			t.Errorf("%s IPv6 external IP: %v", network, seen)
		}
		if seen, _ := ask(t, tp.pods[0], network, "10.96.0.10:80", 20); len(seen) != 2 {
			t.Errorf("%s IPv4 cluster IP next to IPv6: %v", network, seen)
		}
	}
	// IPv6 without endpoints rejects too.
	empty := &portal.Service{Key: key, Portals: []*portal.Portal{
		{Key: portal.PortKey{Service: key, Port: "p", Protocol: portal.TCP, Family: portal.IPv6}, Port: 80, ClusterIPs: []netip.Addr{v6VIP}}}}
	tp.sync(t, snapshot(empty), false)
	mustRefuse(t, tp.pods[0], "tcp", "[fd00:96::10]:80")
}
