package netns_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestAffinitySharedByTheWaysIn: a client of a Service with
// externalTrafficPolicy: Local and ClientIP affinity that reaches a pod
// by a node port is sent to the same pod by the cluster IP, as kube-proxy
// remembers a client per endpoint for every way in. The cluster IP is
// routed to node 1 for the external client; the Service has four pods, two
// on each node, so that each client address would reach the pod it met
// through the node port only one time in four were the ways in to
// remember their clients apart.
func TestAffinitySharedByTheWaysIn(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{})
	ctx := ctxFor(t)
	arrival := c.Nodes[0]
	s := service("sticky", v1.ServiceTypeNodePort, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc, since := expose(t, c, s, c.Pods())
	routeToNode(ctx, t, c, svc.Spec.ClusterIP+"/32", arrival)
	np := hostPort(arrival.IP, svc.Spec.Ports[0].NodePort)
	cip := hostPort(svc.Spec.ClusterIP, 80)
	// Programmed: both ways in answer the client's own address.
	for _, addr := range []string{np, cip} {
		if _, _, err := netns.WaitAnswer(ctx, c.ClientNetns, "tcp", addr, since); err != nil {
			t.Fatal(err)
		}
	}

	for i := range 6 {
		src := fmt.Sprintf("198.51.100.%d", 20+i)
		if err := nsutil.IP(ctx, c.ClientNetns, "addr", "add", src+"/32", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		first, err := askFrom(ctx, c.ClientNetns, src, np)
		if err != nil {
			t.Fatalf("node port from %s: %v", src, err)
		}
		for range 3 {
			r, err := askFrom(ctx, c.ClientNetns, src, cip)
			if err != nil {
				t.Fatalf("cluster IP from %s: %v", src, err)
			}
			if r.Name != first.Name {
				t.Errorf("client %s reached %s by the node port, then %s by the cluster IP", src, first.Name, r.Name)
			}
		}
	}
}

// TestAffinityKeptWhenEndpointsCome: the clients of a Service with ClientIP
// affinity and one pod stay on that pod when a second one comes, as
// kube-proxy remembers a client also while there is one endpoint to
// choose from; new clients go to either.
func TestAffinityKeptWhenEndpointsCome(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 1})
	ctx := ctxFor(t)
	node := c.Nodes[0]
	s := service("grow", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc, since := expose(t, c, s, node.Pods[:1])
	routeToNode(ctx, t, c, svc.Spec.ClusterIP+"/32", node)
	cip := hostPort(svc.Spec.ClusterIP, 80)
	if _, _, err := netns.WaitAnswer(ctx, c.ClientNetns, "tcp", cip, since); err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string {
		src := fmt.Sprintf("198.51.100.%d", 20+i)
		if err := nsutil.IP(ctx, c.ClientNetns, "addr", "add", src+"/32", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		return src
	}
	ask := func(src string) string {
		r, err := askFrom(ctx, c.ClientNetns, src, cip)
		if err != nil {
			t.Fatalf("cluster IP from %s: %v", src, err)
		}
		return r.Name
	}
	first := node.Pods[0].Name
	var clients []string
	for i := range 6 {
		src := addr(i)
		if got := ask(src); got != first {
			t.Fatalf("one endpoint, %s, but %s answered %s", first, got, src)
		}
		clients = append(clients, src)
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(node.Pods...)); err != nil {
		t.Fatal(err)
	}
	// Applied once a new client reaches the second pod.
	for i := len(clients); ask(addr(i)) != node.Pods[1].Name; i++ {
		if i > 200 {
			t.Fatalf("no new client reached %s after it became an endpoint", node.Pods[1].Name)
		}
	}
	for _, src := range clients {
		if got := ask(src); got != first {
			t.Errorf("client %s of %s went to %s when a second pod came", src, first, got)
		}
	}
}

// routeToNode makes the router send prefix to node n until the test ends.
func routeToNode(ctx context.Context, t *testing.T, c *netns.Cluster, prefix string, n *netns.Node) {
	t.Helper()
	if err := c.RouteExternal(ctx, prefix, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsutil.IP(context.Background(), c.Router, "route", "del", prefix) })
}
