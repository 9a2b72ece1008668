package netns_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// The external client reaches every endpoint through the NodePort of each
// node.
func testNodePortFromClient(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, since := expose(t, c, service("np", v1.ServiceTypeNodePort, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	np := svc.Spec.Ports[0].NodePort
	if np == 0 {
		t.Fatal("no nodePort allocated")
	}
	for _, n := range c.Nodes {
		d, err := netns.WaitBackends(ctx, c.ClientNetns, "tcp", hostPort(n.IP, np), pods, since)
		if err != nil {
			t.Fatalf("via %s: %v", n.Name, err)
		}
		lat.add(t, "NodePort via "+n.Name, d)
	}
}

// The external client reaches every endpoint through spec.externalIPs (in
// the agent's --external-ip-cidrs), routed by the router to node 1.
func testExternalIPFromClient(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	ext := netns.ExternalIP(10).String()
	s := service("extip", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP), port("dns", v1.ProtocolUDP, 53, netns.PortDNS))
	s.Spec.ExternalIPs = []string{ext}
	_, since := expose(t, c, s, pods)
	for _, proto := range []string{"tcp", "udp"} {
		p := int32(80)
		if proto == "udp" {
			p = 53
		}
		d, err := netns.WaitBackends(ctx, c.ClientNetns, proto, hostPort(ext, p), pods, since)
		if err != nil {
			t.Fatal(err)
		}
		lat.add(t, "externalIP "+proto, d)
	}
}

// A LoadBalancer Service answers on the ingress IP its status carries, as
// soon as the status is written.
func testLoadBalancerIngress(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, _ := expose(t, c, service("lb", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	ingress := netns.ExternalIP(20).String()
	addr := hostPort(ingress, 80)
	if _, err := nsutil.Request(ctx, c.ClientNetns, "tcp", addr); err == nil {
		t.Fatalf("%s answered before the service had that ingress IP", addr)
	}
	if _, err := c.SetLoadBalancerIngress(ctx, svc, ingress); err != nil {
		t.Fatal(err)
	}
	d, err := netns.WaitBackends(ctx, c.ClientNetns, "tcp", addr, pods, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lat.add(t, "LB ingress IP written to status", d)
}

// With externalTrafficPolicy: Local, traffic to the LB IP stays on the node it
// arrives at (node 2 here) and the pod sees the external client's address.
func testLoadBalancerLocal(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	s := service("lblocal", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc, _ := expose(t, c, s, pods)
	ingress := netns.ExternalIP(30).String()
	arrival := c.Nodes[1]
	route := ingress + "/32"
	if err := c.RouteExternal(ctx, route, arrival); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsutil.IP(context.Background(), c.Router, "route", "del", route) })
	if _, err := c.SetLoadBalancerIngress(ctx, svc, ingress); err != nil {
		t.Fatal(err)
	}
	addr := hostPort(ingress, 80)
	d, err := netns.WaitBackends(ctx, c.ClientNetns, "tcp", addr, arrival.Pods, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lat.add(t, "LB ingress, externalTrafficPolicy Local", d)
	for i := 0; i < 10; i++ {
		rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if rep.SourceIP() != netns.ClientIP().String() {
			t.Errorf("%s saw source %s, want the client's %s", rep.Name, rep.SourceIP(), netns.ClientIP())
		}
	}
}
