package ipvs

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestSourceRangesApplyToTheNode: loadBalancerSourceRanges that leave the
// node out keep the node's own connections (a hostNetwork pod's) away
// from the load-balancer IP, as they keep other clients away; ranges that
// include the node's address let it in. Allowed clients outside are served
// either way.
func TestSourceRangesApplyToTheNode(t *testing.T) {
	n := newTestNet(t, 2)
	const closedIP, openIP = "203.0.113.30", "203.0.113.31"
	lb := func(name, cip, ip, ranges string, nodePort int32) *v1.Service {
		return service(name, cip, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = nodePort
			s.Spec.LoadBalancerSourceRanges = []string{ranges}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip}}
		})
	}
	a := n.startAgent(
		lb("closed", "10.96.5.10", closedIP, clientIP+"/32", 30120), slice("closed", 1, 2),
		lb("open", "10.96.5.11", openIP, "192.168.50.0/24", 30121), slice("open", 1, 2))
	a.waitSynced()

	for _, ip := range []string{closedIP, openIP} {
		if c, err := n.dial(n.client, ip+":80"); err != nil {
			t.Errorf("an allowed client to %s: %v", ip, err)
		} else {
			c.Close()
		}
	}
	if c, err := n.dial(n.node, closedIP+":80"); err == nil {
		c.Close()
		t.Errorf("the node reached %s (%s) though its ranges leave the node out", closedIP, c.Pod)
	}
	if c, err := n.dial(n.node, openIP+":80"); err != nil {
		t.Errorf("the node to %s, whose ranges include it: %v", openIP, err)
	} else {
		c.Close()
	}
	// The cluster IP of the closed Service is not a load-balancer entry.
	if c, err := n.dial(n.node, "10.96.5.10:80"); err != nil {
		t.Errorf("the node to the closed Service's cluster IP: %v", err)
	} else {
		c.Close()
	}
}
