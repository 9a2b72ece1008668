package portalfuzz

import (
	"net/netip"
	"testing"

	"github.com/onehop/onehop/portal"
)

// Encode then Decode gives the Services back.
func TestEncodeDecode(t *testing.T) {
	k := portal.ServiceKey{Namespace: "shop", Name: "web"}
	ap := netip.MustParseAddrPort
	in := map[portal.ServiceKey]*portal.Service{k: {Key: k, Portals: []*portal.Portal{
		{Key: portal.PortKey{Service: k, Port: "http", Protocol: portal.TCP, Family: portal.IPv4}, Port: 80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.1.1")}, NodePort: 30080,
			ExternalIPs:     []netip.Addr{netip.MustParseAddr("198.51.100.7")},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.10")},
			SourceRanges:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
			ExternalLocal:   true, HealthCheckNodePort: 32000, Affinity: portal.Affinity{TimeoutSeconds: 10800}, Scheduler: "mh",
			ClusterEndpoints: []netip.AddrPort{ap("10.244.1.10:8080"), ap("10.244.2.11:8080")},
			LocalEndpoints:   []netip.AddrPort{ap("10.244.1.10:8080")}, LocalReady: 1},
		{Key: portal.PortKey{Service: k, Port: "http", Protocol: portal.UDP, Family: portal.IPv6}, Port: 80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::1")}, ClusterEndpoints: []netip.AddrPort{ap("[fd00:244::1]:53")}},
	}}}
	out := Decode(Encode(in))
	if len(out) != 1 || !out[k].Equal(in[k]) {
		t.Errorf("round trip:\n got %+v\nwant %+v", out[k], in[k])
	}
}
