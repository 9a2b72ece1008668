package netns_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestSourceRangesLetTheNodeLoopBack: a LoadBalancer Service whose
// loadBalancerSourceRanges hold the node's address also lets in packets
// whose source is its load-balancer IP, as kube-proxy does: a VIP is often
// a local address of the node, and the node's own connection to it then
// loops back with the VIP as its source. The client outside the ranges
// stays dropped.
func TestSourceRangesLetTheNodeLoopBack(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 1})
	ctx := ctxFor(t)
	node := c.Nodes[0]
	vip := netns.ExternalIP(41).String()
	// The VIP is local to the node, as a load balancer that routes it
	// there with an ip rule or an address would make it, and the router
	// sends the client's packets for it to the node.
	if err := nsutil.IP(ctx, node.Netns, "addr", "add", vip+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	routeToNode(ctx, t, c, vip+"/32", node)

	s := service("ranged", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.LoadBalancerSourceRanges = []string{netns.NodeCIDR}
	svc, _ := expose(t, c, s, node.Pods)
	if _, err := c.SetLoadBalancerIngress(ctx, svc, vip); err != nil {
		t.Fatal(err)
	}
	addr := hostPort(vip, 80)
	// The node from its own address: inside the ranges.
	waitOutcomeFrom(ctx, t, node.Netns, node.IP, addr, outcomeAnswered)
	// The node from the VIP: let in because the ranges hold the node.
	waitOutcomeFrom(ctx, t, node.Netns, vip, addr, outcomeAnswered)
	// The client: outside the ranges, dropped.
	waitOutcomeFrom(ctx, t, c.ClientNetns, netns.ClientIP().String(), addr, outcomeDropped)

	// Ranges that leave the node out: the VIP is no longer let in.
	updateSpec(ctx, t, c, svc, func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"} })
	waitOutcomeFrom(ctx, t, node.Netns, vip, addr, outcomeDropped)
	waitOutcomeFrom(ctx, t, c.ClientNetns, netns.ClientIP().String(), addr, outcomeAnswered)
}

// updateSpec changes svc through the API, retrying on conflicts.
func updateSpec(ctx context.Context, t *testing.T, c *netns.Cluster, svc *v1.Service, change func(*v1.Service)) *v1.Service {
	t.Helper()
	for {
		cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(cur)
		up, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			return up
		}
		if ctx.Err() != nil {
			t.Fatalf("update service %s: %v", svc.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
