package external

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

// TestCRDBGPAggregateOnlyWhatTheNodeServes: a BGPAdvertisement aggregates
// its pool's addresses to /26, and the /26 holds two
// externalTrafficPolicy Local Services whose endpoints are on different
// nodes (a on node1, b on node2) and a Cluster Service (c, both nodes).
// An aggregate is announced only where every address in it is served by
// the same nodes: here it is not, so each node announces its own
// addresses alone, a via node1 only, b via node2 only, c via both, and
// the router holds no /26 (announced by both, it would send half of a's
// and b's clients to a node without their endpoint). The same once b is
// gone (a and c are still served by different nodes). With a's endpoints
// on both nodes too, both announce the /26 alone again. A client reaches
// each address through the node serving it (each node's stand-in
// dataplane serves only its own addresses).
func TestCRDBGPAggregateOnlyWhatTheNodeServes(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	lab.internalPeering(t)
	// The lab's stand-in dataplane serves vip (a) on both nodes, each to
	// its own pod; b only where its endpoint is, c on both: a request
	// routed to a node that does not serve its address fails, or reaches
	// the wrong pod.
	lab.exec("node2", "nft", "add", "rule", "inet", "ohxtest", "pre", "ip", "daddr", "203.0.113.20", "tcp", "dport", "80", "dnat", "ip", "to", "10.244.2.2:8080")
	for i, n := range []string{"node1", "node2"} {
		lab.exec(n, "nft", "add", "rule", "inet", "ohxtest", "pre", "ip", "daddr", "203.0.113.30", "tcp", "dport", "80", "dnat", "ip", "to", fmt.Sprintf("10.244.%d.2:8080", i+1))
	}

	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	sp.runAll(lab.topo, sp.config(config.Config{CRDs: true}))
	const agg = "203.0.113.0/26"
	cr.apply(v1alpha1.LoadBalancerIPPools, "lab", `{addresses: ["`+agg+`"]}`)
	cr.apply(v1alpha1.BGPPeers, "router", `{myASN: 64512, peerASN: 64512, peerAddress: 10.0.0.1, holdTimeSeconds: 9}`)
	cr.apply(v1alpha1.BGPAdvertisements, "agg", `{ipAddressPools: [lab], aggregationLength: 26}`)
	cr.accepted(v1alpha1.BGPAdvertisements, "agg", "True", "in force")

	ips := map[string]string{"a": "203.0.113.10", "b": "203.0.113.20", "c": "203.0.113.30"}
	eps := map[string]map[string]string{
		"a": {"node1": "10.244.1.2"},
		"b": {"node2": "10.244.2.2"},
		"c": {"node1": "10.244.1.2", "node2": "10.244.2.2"},
	}
	for _, name := range []string{"a", "b", "c"} {
		createLB(t, c, name, 80, func(s *corev1.Service) {
			s.Annotations = map[string]string{alloc.AnnotationLoadBalancerIPs: ips[name]}
			if name != "c" {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
		})
		if got := lbIPs(t, c, name, "allocation", some); got[0] != ips[name] {
			t.Fatalf("%s got %v, want %s", name, got, ips[name])
		}
		setEndpoints(t, c, name, eps[name])
	}
	lab.waitHopsFor(t, ips["a"], "a, Local on node1, alone", "10.0.0.11")
	lab.waitHopsFor(t, ips["b"], "b, Local on node2, alone", "10.0.0.12")
	lab.waitHopsFor(t, ips["c"], "c, Cluster, alone from both", "10.0.0.11", "10.0.0.12")
	if hops := lab.nextHopsFor(agg); len(hops) > 0 {
		t.Errorf("the router has the aggregate %s via %v, though no node serves all of it", agg, hops)
	}
	for name, pod := range map[string]string{"a": "pod1", "b": "pod2", "c": "pod"} {
		for range 10 {
			if got, err := lab.get("client", ips[name]+":80"); err != nil || !strings.HasPrefix(got, pod) {
				t.Fatalf("client -> %s (%s): %q, %v; want %s", name, ips[name], got, err, pod)
			}
		}
	}

	if err := c.CoreV1().Services("default").Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lab.waitHopsFor(t, ips["b"], "b gone: its route withdrawn")
	lab.waitHopsFor(t, ips["a"], "b gone: a still alone from node1", "10.0.0.11")
	lab.waitHopsFor(t, ips["c"], "b gone: c still alone from both", "10.0.0.11", "10.0.0.12")
	if hops := lab.nextHopsFor(agg); len(hops) > 0 {
		t.Errorf("b gone: the router has the aggregate %s via %v, though a and c are served by different nodes", agg, hops)
	}

	setEndpoints(t, c, "a", eps["c"])
	lab.waitHopsFor(t, agg, "a on both nodes too: the aggregate", "10.0.0.11", "10.0.0.12")
	lab.waitHopsFor(t, ips["a"], "a on both nodes too: no host route")
	lab.waitHopsFor(t, ips["c"], "a on both nodes too: no host route")
	for _, name := range []string{"a", "c"} {
		if got, err := lab.get("client", ips[name]+":80"); err != nil || !strings.HasPrefix(got, "pod") {
			t.Fatalf("client -> %s through the aggregate: %q, %v", name, got, err)
		}
	}
}
