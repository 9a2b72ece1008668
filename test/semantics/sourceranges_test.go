package semantics_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// loadBalancerSourceRanges: once set, the allowed client still reaches the
// LB IP and another external host (the router, 192.0.2.1) no longer does;
// removing them lets it in again.
func testSourceRanges(t *testing.T, c *netns.Cluster) {
	pods := c.Pods()
	svc, _ := expose(t, c, service("fenced", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(pods...))
	ingress := netns.ExternalIP(41).String() // routed to node 1
	if _, err := c.SetLoadBalancerIngress(ctxFor(t), svc, ingress); err != nil {
		t.Fatal(err)
	}
	addr := hostPort(ingress, 80)
	since := time.Now()
	d, err := netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", addr, pods, since)
	if err != nil {
		t.Fatal(err)
	}
	logLatency(t, "LB IP from the client, no source ranges", d)
	_, d = waitAnswer(t, c.Router, "tcp", addr, since)
	logLatency(t, "LB IP from the router, no source ranges", d)

	set := time.Now()
	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{netns.ClientIP().String() + "/32"}
	})
	d, err = netns.WaitUnserved(ctxFor(t), c.Router, "tcp", addr, set)
	if err != nil {
		t.Fatalf("source ranges %s/32: the router (not in them): %v", netns.ClientIP(), err)
	}
	logLatency(t, "source ranges set: router refused", d)
	// Checked once the router is refused, i.e. once the ranges are in force.
	if d, err = netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", addr, pods, time.Now()); err != nil {
		t.Fatalf("source ranges %s/32: the client (in them): %v", netns.ClientIP(), err)
	}
	logLatency(t, "source ranges in force: client still reaches every endpoint (polling time)", d)

	cleared := time.Now()
	updateService(t, c, svc, func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = nil })
	_, d = waitAnswer(t, c.Router, "tcp", addr, cleared)
	logLatency(t, "source ranges removed: router reaches again", d)
}
