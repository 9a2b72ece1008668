package netns_test

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// A pod reaches every endpoint, on both nodes, through the cluster IP, and
// the endpoints see the pod's own address (no masquerade inside the cluster).
func testClusterIPFromPod(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, since := expose(t, c, service("web", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	from := c.Nodes[0].Pods[0]
	addr := hostPort(svc.Spec.ClusterIP, 80)
	d, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods, since)
	if err != nil {
		t.Fatal(err)
	}
	lat.add(t, "new ClusterIP service, 4 endpoints on 2 nodes", d)

	for _, target := range pods {
		if target == from {
			continue // hairpin: masqueraded by design
		}
		rep := askUntil(t, from.Netns, "tcp", addr, target)
		if rep.SourceIP() != from.IP {
			t.Errorf("%s saw source %s, want the client pod's %s", target.Name, rep.SourceIP(), from.IP)
		}
	}
}

// askUntil requests until target answers (bounded) and returns that reply.
func askUntil(t *testing.T, from, proto, addr string, target *netns.Pod) nsutil.Reply {
	t.Helper()
	ctx := ctxFor(t)
	for i := 0; i < 200; i++ {
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err != nil {
			t.Fatalf("%s %s: %v", proto, addr, err)
		}
		if rep.Name == target.Name {
			return rep
		}
	}
	t.Fatalf("%s %s: %s never answered in 200 requests", proto, addr, target.Name)
	return nsutil.Reply{}
}

// Two ports of one Service reach their own target ports.
func testMultiPort(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, since := expose(t, c, service("multi", v1.ServiceTypeClusterIP,
		port("http", v1.ProtocolTCP, 80, netns.PortHTTP),
		port("alt", v1.ProtocolTCP, 8000, netns.PortAlt),
	), pods)
	from := c.Nodes[1].Pods[0]
	for _, p := range []struct {
		port, target int
	}{{80, netns.PortHTTP}, {8000, netns.PortAlt}} {
		addr := hostPort(svc.Spec.ClusterIP, int32(p.port))
		d, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods, since)
		if err != nil {
			t.Fatal(err)
		}
		lat.add(t, "multi-port service", d)
		for i := 0; i < 8; i++ {
			rep, err := nsutil.Request(ctx, from.Netns, "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Port != p.target {
				t.Errorf("service port %d reached pod port %d, want %d", p.port, rep.Port, p.target)
			}
		}
	}
}

// One port number, two protocols: TCP and UDP each reach the pod on their own
// protocol.
func testSamePortTCPAndUDP(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, since := expose(t, c, service("dns", v1.ServiceTypeClusterIP,
		port("dns-tcp", v1.ProtocolTCP, 53, netns.PortDNS),
		port("dns-udp", v1.ProtocolUDP, 53, netns.PortDNS),
	), pods)
	from := c.Nodes[0].Pods[1]
	addr := hostPort(svc.Spec.ClusterIP, 53)
	for _, proto := range []string{"tcp", "udp"} {
		d, err := netns.WaitBackends(ctx, from.Netns, proto, addr, pods, since)
		if err != nil {
			t.Fatal(err)
		}
		lat.add(t, "port 53 "+proto, d)
		rep, err := nsutil.Request(ctx, from.Netns, proto, addr)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Proto != proto || rep.Port != netns.PortDNS {
			t.Errorf("%s to port 53 arrived as %s/%d, want %s/%d", proto, rep.Proto, rep.Port, proto, netns.PortDNS)
		}
	}
}

// A dual-stack Service answers on its IPv4 and its IPv6 cluster IP, each
// reaching every endpoint through that family's EndpointSlice.
func testDualStack(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	s := service("dual", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP), port("dns", v1.ProtocolUDP, 53, netns.PortDNS))
	s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	svc, since := expose(t, c, s, pods)
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("cluster IPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	from := c.Nodes[1].Pods[1]
	for _, ip := range svc.Spec.ClusterIPs {
		for _, pp := range []struct {
			proto string
			port  int32
		}{{"tcp", 80}, {"udp", 53}} {
			d, err := netns.WaitBackends(ctx, from.Netns, pp.proto, hostPort(ip, pp.port), pods, since)
			if err != nil {
				t.Fatal(err)
			}
			lat.add(t, "dual-stack "+pp.proto+" "+ip, d)
		}
	}
}
