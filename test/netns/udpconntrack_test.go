package netns_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
)

// A UDP flow has no handshake: while its conntrack entry lives (refreshed
// by every datagram) each datagram follows the NAT decision the entry
// pinned when the flow began. These cases keep one flow per client (one
// fixed source port) sending across a Service change made through the API,
// and want the flow to follow the change as kube-proxy users expect: the
// agent deletes the entries the change left pointing the wrong way.
//
// The deadlines are liveness bounds (flowDeadline), far below conntrack's
// UDP timeouts (30 s, 120 s once a flow is assured), which a flow sending
// every 100 ms never reaches: without the cleanup the old decision would
// hold for as long as the flow runs.
func TestUDPConntrack(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{})
	lat := &latencies{}
	t.Cleanup(func() { lat.log(t) })
	run := func(name string, fn func(*testing.T, *netns.Cluster, *latencies)) {
		t.Run(name, func(t *testing.T) { fn(t, c, lat) })
	}
	// First: its cluster IP and NodePort are fixed, and free while no
	// other case has taken addresses.
	run("CreatedWhileSending", testUDPCreatedWhileSending)
	soon := newCleanTrigger(t, c)
	run("ServiceDeleted", testUDPServiceDeleted(nil))
	run("ServiceDeletedSoonAfterEndpoints", testUDPServiceDeleted(soon))
	run("ScaledToZero", testUDPScaledToZero(nil))
	run("ScaledToZeroSoonAfterEndpoints", testUDPScaledToZero(soon))
	run("EndpointReplaced", testUDPEndpointReplaced)
	run("EndpointGoneOthersRemain", testUDPEndpointGoneOthersRemain)
	run("TerminatingServingKeepsFlow", testUDPTerminatingServingKeepsFlow)
	run("InternalTrafficPolicyFlipKeepsFlow", testUDPInternalPolicyFlipKeepsFlow)
}

// udpService is a Service with one UDP port 53 to the pods' PortDNS.
func udpService(name string, typ v1.ServiceType) *v1.Service {
	return service(name, typ, port("dns", v1.ProtocolUDP, 53, netns.PortDNS))
}

// flowSpec is one client of a case: the namespace it sends from and the
// Service's way in it sends to.
type flowSpec struct {
	name string
	from string
	to   func(svc *v1.Service) string
}

func toClusterIP(svc *v1.Service) string { return hostPort(svc.Spec.ClusterIP, 53) }

func toNodePort(n *netns.Node) func(*v1.Service) string {
	return func(svc *v1.Service) string { return hostPort(n.IP, svc.Spec.Ports[0].NodePort) }
}

// establish creates svc with target as its only endpoint, starts one flow
// per spec once the Service answers there, and returns when each flow has
// reached target. With soon, the agents have cleaned their conntrack
// tables just before (see cleanTrigger) and each flow counts as running at
// its first answer, so that what the caller changes next reaches the
// agents within the same second as the Service's endpoint did.
func establish(t *testing.T, c *netns.Cluster, svc *v1.Service, target *netns.Pod, specs []flowSpec, soon *cleanTrigger) (*v1.Service, []*udpFlow) {
	t.Helper()
	if soon != nil {
		soon.now(t)
	}
	created, since := expose(t, c, svc, []*netns.Pod{target})
	var flows []*udpFlow
	for _, s := range specs {
		flows = append(flows, startServedUDPFlow(t, s.name, s.from, s.to(created)))
	}
	streak := 5
	if soon != nil {
		streak = 1
	}
	for _, f := range flows {
		if _, ok := f.waitStreak(t, "reach "+target.Name, since, streak, func(o flowOutcome) bool { return o.pod == target.Name }); !ok {
			t.FailNow()
		}
	}
	return created, flows
}

// A Service is deleted while flows run to its cluster IP from pods and
// from the node itself: they stop reaching the old pod. With soon, the
// Service goes within a second of getting its endpoint.
func testUDPServiceDeleted(soon *cleanTrigger) func(*testing.T, *netns.Cluster, *latencies) {
	return func(t *testing.T, c *netns.Cluster, lat *latencies) {
		ctx := ctxFor(t)
		target := c.Nodes[1].Pods[0]
		svc, flows := establish(t, c, udpService("udp-gone", v1.ServiceTypeClusterIP), target, []flowSpec{
			{"from a pod on another node", c.Nodes[0].Pods[0].Netns, toClusterIP},
			{"from a pod on the same node", c.Nodes[1].Pods[1].Netns, toClusterIP},
			{"from the node itself", c.Nodes[1].Netns, toClusterIP},
		}, soon)
		if err := c.DeleteService(ctx, svc.Namespace, svc.Name); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		for _, f := range flows {
			followed(t, lat, "Service deleted -> flow "+f.name+" stops")(f.undelivered(t, deleted))
		}
	}
}

// The Service scales to zero while flows run through its cluster IP and
// its NodePort, from a pod and from the node itself: none is delivered any
// more (they are rejected, as a new flow would be). With soon, the Service
// scales to zero within a second of getting its endpoint.
func testUDPScaledToZero(soon *cleanTrigger) func(*testing.T, *netns.Cluster, *latencies) {
	return func(t *testing.T, c *netns.Cluster, lat *latencies) {
		ctx := ctxFor(t)
		node := c.Nodes[0]
		pod, target := node.Pods[0], c.Nodes[1].Pods[1]
		svc, flows := establish(t, c, udpService("udp-zero", v1.ServiceTypeNodePort), target, []flowSpec{
			{"ClusterIP from a pod", pod.Netns, toClusterIP},
			{"ClusterIP from the node", node.Netns, toClusterIP},
			{"NodePort from a pod", pod.Netns, toNodePort(node)},
			{"NodePort from the node", node.Netns, toNodePort(node)},
		}, soon)
		if err := c.SetEndpoints(ctx, svc, nil); err != nil {
			t.Fatal(err)
		}
		zero := time.Now()
		for _, f := range flows {
			followed(t, lat, "scaled to zero -> "+f.name+" not delivered")(f.undelivered(t, zero))
		}
		for _, f := range flows {
			t.Logf("flow %s after the scale to zero: %s (%d refused)", f.name, f.summary(zero), f.refused(zero))
		}
	}
}

// The Service's only endpoint is replaced by another pod: the running
// flows move to the new pod.
func testUDPEndpointReplaced(t *testing.T, c *netns.Cluster, lat *latencies) {
	node := c.Nodes[1]
	old, repl := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1]
	svc, flows := establish(t, c, udpService("udp-moved", v1.ServiceTypeNodePort), old, []flowSpec{
		{"ClusterIP from a pod", node.Pods[0].Netns, toClusterIP},
		{"NodePort from the node", node.Netns, toNodePort(node)},
		{"NodePort from the client", c.ClientNetns, toNodePort(node)},
	}, nil)
	moveFlows(t, c, lat, svc, netns.Ready(repl), flows, repl, "endpoint replaced -> %s on the new pod")
}

// moveFlows gives svc the endpoints eps and waits until each flow reaches
// pod, recording how long it took as what (with the flow's name).
func moveFlows(t *testing.T, c *netns.Cluster, lat *latencies, svc *v1.Service, eps []netns.Endpoint, flows []*udpFlow, pod *netns.Pod, what string) {
	t.Helper()
	if err := c.SetEndpoints(ctxFor(t), svc, eps); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	for _, f := range flows {
		followed(t, lat, fmt.Sprintf(what, f.name))(f.reaches(t, pod, changed))
	}
}

// One of two endpoints goes away: the flow it served moves to the other.
func testUDPEndpointGoneOthersRemain(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pod := c.Nodes[0].Pods[1]
	eps := []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	svc, since := expose(t, c, udpService("udp-shrink", v1.ServiceTypeClusterIP), eps)
	vip := hostPort(svc.Spec.ClusterIP, 53)
	if _, err := netns.WaitBackends(ctx, pod.Netns, "udp", vip, eps, since); err != nil {
		t.Fatal(err)
	}
	f := startServedUDPFlow(t, "ClusterIP from a pod", pod.Netns, vip)
	gone := f.answeredBy(t, c, since)
	remain := eps[0]
	if remain == gone {
		remain = eps[1]
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(remain)); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	followed(t, lat, "endpoint gone -> flow on the remaining pod")(f.reaches(t, remain, changed))
}

// Flows already send to a cluster IP and a NodePort before their Service
// exists: their datagrams are routed away or refused, and conntrack
// remembers that un-NATed. Once the Service is created with an endpoint the
// flows reach it.
func testUDPCreatedWhileSending(t *testing.T, c *netns.Cluster, lat *latencies) {
	node := c.Nodes[0]
	pod, target := node.Pods[1], c.Nodes[1].Pods[1]
	const clusterIP, nodePort = "10.96.53.53", 31053
	vip := hostPort(clusterIP, 53)
	flows := []*udpFlow{
		startUDPFlow(t, "ClusterIP from a pod", pod.Netns, vip),
		startUDPFlow(t, "ClusterIP from the node", node.Netns, vip),
		startUDPFlow(t, "NodePort from a pod", pod.Netns, hostPort(node.IP, nodePort)),
		startUDPFlow(t, "NodePort from the node", node.Netns, hostPort(node.IP, nodePort)),
		startUDPFlow(t, "NodePort from the client", c.ClientNetns, hostPort(node.IP, nodePort)),
	}
	for _, f := range flows { // each flow has its un-NATed entry
		if _, ok := f.undelivered(t, time.Time{}); !ok {
			t.FailNow()
		}
	}
	s := udpService("udp-late", v1.ServiceTypeNodePort)
	s.Spec.ClusterIP = clusterIP
	s.Spec.Ports[0].NodePort = nodePort
	_, since := expose(t, c, s, []*netns.Pod{target})
	for _, f := range flows {
		followed(t, lat, "Service created -> "+f.name+" reaches it")(f.reaches(t, target, since))
	}
}

// The pod a flow runs to becomes terminating but still serving while
// another is ready: new flows go to the ready pod, and the running ones,
// through the cluster IP and a NodePort, stay on theirs until it stops
// serving, as in kube-proxy (a TCP connection would stay too); then they
// move.
func testUDPTerminatingServingKeepsFlow(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	node := c.Nodes[0]
	pod, old, ready := node.Pods[0], c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	barrier := newCleanBarrier(t, c, "udp-barrier-drain", pod)
	svc, flows := establish(t, c, udpService("udp-drain", v1.ServiceTypeNodePort), old, []flowSpec{
		{"ClusterIP from a pod", pod.Netns, toClusterIP},
		{"NodePort from the client", c.ClientNetns, toNodePort(node)},
	}, nil)
	vip, np := toClusterIP(svc), toNodePort(node)(svc)
	if err := c.SetEndpoints(ctx, svc, netns.Ready(old, ready)); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.WaitBackends(ctx, pod.Netns, "udp", vip, []*netns.Pod{old, ready}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEndpoints(ctx, svc, []netns.Endpoint{{Pod: old, Terminating: true, Serving: true}, {Pod: ready}}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitOnly(ctx, t, pod.Netns, vip, ready, changed)
	waitOnly(ctx, t, c.ClientNetns, np, ready, changed)
	passed := barrier.pass(t)
	for _, f := range flows {
		f.stays(t, old, changed, passed)
	}
	// It stops serving: new flows went to the ready pod already, so only
	// what serves changes, and the running flows move.
	moveFlows(t, c, lat, svc, []netns.Endpoint{{Pod: old, Terminating: true}, {Pod: ready}}, flows, ready,
		"endpoint stops serving -> %s on the ready pod")
}

// A flow from a pod runs, under internalTrafficPolicy Local, to the only
// endpoint on its node, which becomes terminating but still serving while
// a pod on the other node is ready; then the policy flips to Cluster: new
// flows go to the ready pod, and the running one stays on its pod, as in
// kube-proxy, which keeps a flow to any serving endpoint whatever the
// traffic policies.
func testUDPInternalPolicyFlipKeepsFlow(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	node := c.Nodes[0]
	pod, local, ready := node.Pods[0], node.Pods[1], c.Nodes[1].Pods[0]
	barrier := newCleanBarrier(t, c, "udp-barrier-itp", pod)
	s := udpService("udp-itp", v1.ServiceTypeClusterIP)
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	svc, flows := establish(t, c, s, local, []flowSpec{{"ClusterIP from a pod", pod.Netns, toClusterIP}}, nil)
	vip := toClusterIP(svc)
	if err := c.SetEndpoints(ctx, svc, []netns.Endpoint{{Pod: local, Terminating: true, Serving: true}, {Pod: ready}}); err != nil {
		t.Fatal(err)
	}
	cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
	if _, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitOnly(ctx, t, pod.Netns, vip, ready, changed)
	passed := barrier.pass(t)
	for _, f := range flows {
		f.stays(t, local, changed, passed)
	}
}

// waitOnly waits until fresh UDP requests from namespace from to addr are
// answered by pod alone: the agent there has applied a change.
func waitOnly(ctx context.Context, t *testing.T, from, addr string, pod *netns.Pod, since time.Time) {
	t.Helper()
	if _, err := netns.WaitBackends(ctx, from, "udp", addr, []*netns.Pod{pod}, since); err != nil {
		t.Fatal(err)
	}
}
