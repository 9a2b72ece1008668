package netns_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// Deleting a Service stops its traffic; creating it again (same cluster IP)
// brings it back.
func testDeleteRecreate(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	from := c.Nodes[1].Pods[1]
	svc, since := expose(t, c, service("phoenix", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	if _, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods, since); err != nil {
		t.Fatal(err)
	}

	if err := c.DeleteService(ctx, svc.Namespace, svc.Name); err != nil {
		t.Fatal(err)
	}
	d, err := netns.WaitUnserved(ctx, from.Netns, "tcp", addr, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lat.add(t, "service deleted -> traffic stops", d)

	again := service("phoenix", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	again.Spec.ClusterIP = svc.Spec.ClusterIP
	_, since = expose(t, c, again, pods)
	d, err = netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods, since)
	if err != nil {
		t.Fatal(err)
	}
	lat.add(t, "service re-created -> traffic back", d)
}

// An endpoint added to the slice starts taking traffic; one removed stops.
func testEndpointChanges(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	a, b, x := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	from := c.Nodes[0].Pods[1]
	svc, since := expose(t, c, service("churn", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), []*netns.Pod{a, b})
	addr := hostPort(svc.Spec.ClusterIP, 80)
	if _, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, []*netns.Pod{a, b}, since); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		what string
		eps  []netns.Endpoint
		want []*netns.Pod
	}{
		{"endpoint added", netns.Ready(a, b, x), []*netns.Pod{a, b, x}},
		{"endpoint removed", netns.Ready(b, x), []*netns.Pod{b, x}},
		{"endpoint not ready", append(netns.Ready(b), netns.Endpoint{Pod: x, NotReady: true}), []*netns.Pod{b}},
		{"endpoint ready again", netns.Ready(b, x), []*netns.Pod{b, x}},
		{"all endpoints gone", nil, nil},
		{"endpoint back", netns.Ready(a), []*netns.Pod{a}},
	}
	for _, s := range steps {
		if err := c.SetEndpoints(ctx, svc, s.eps); err != nil {
			t.Fatal(err)
		}
		d, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, s.want, time.Now())
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		lat.add(t, s.what, d)
	}
}
