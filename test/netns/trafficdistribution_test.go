package netns_test

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// trafficDistributionRequests is how many requests each check sends once
// the agent has converged: with two endpoints chosen at random, all of
// them reaching one has a chance of 2^-29.
const trafficDistributionRequests = 30

// trafficDistribution: the hints the EndpointSlice controller writes reach
// the agents through a real kube-apiserver and decide, per node, which
// endpoints a pod's connections reach, as kube-proxy v1.37 decides it:
// node hints first, then zone hints, each only when every ready endpoint
// has one and one names this node (its zone). Three nodes; node-1 and
// node-2 share zone-a, node-3 is in zone-c, so that same-node and
// same-zone give different answers. Each node's second pod serves, its
// first one asks.
func TestTrafficDistribution(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 3})
	setZone(t, c, c.Nodes[1], c.Nodes[0].Zone)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	e1, e2, e3 := n1.Pods[1], n2.Pods[1], n3.Pods[1]

	t.Run("PreferSameNode", func(t *testing.T) {
		svc := distributed(t, c, "near-node", v1.ServiceTypeClusterIP, v1.ServiceTrafficDistributionPreferSameNode)
		addr := hostPort(svc.Spec.ClusterIP, 80)

		// Every node has an endpoint: each pod reaches its own node's.
		setHinted(t, c, svc, e1, e2, e3)
		answeredBy(t, from(n1.Pods[0]), addr, e1)
		answeredBy(t, from(n2.Pods[0]), addr, e2)
		dumpSays(t, c, n1, "default/near-node", "node hints for "+n1.Name)

		// node-1's endpoint gone: no node hint names node-1, so zone
		// hints decide: node-2's endpoint, in node-1's zone, not node-3's.
		setHinted(t, c, svc, e2, e3)
		answeredBy(t, from(n1.Pods[0]), addr, e2)
		dumpSays(t, c, n1, "default/near-node", "zone hints for "+n1.Zone)

		// Endpoints on node-3 only: neither node-1 nor its zone is
		// hinted, so every endpoint serves node-1.
		setHinted(t, c, svc, e3, n3.Pods[0])
		answeredBy(t, from(n1.Pods[0]), addr, e3, n3.Pods[0])
		dumpSays(t, c, n1, "default/near-node", "none: no endpoint hinted for node "+n1.Name+"; no endpoint hinted for zone "+n1.Zone)
	})

	t.Run("PreferSameZone", func(t *testing.T) {
		svc := distributed(t, c, "near-zone", v1.ServiceTypeClusterIP, v1.ServiceTrafficDistributionPreferSameZone)
		addr := hostPort(svc.Spec.ClusterIP, 80)

		// node-1 reaches the endpoints of zone-a, on node-1 and node-2;
		// node-3 its own zone's.
		setHinted(t, c, svc, e1, e2, e3)
		answeredBy(t, from(n1.Pods[0]), addr, e1, e2)
		answeredBy(t, from(n3.Pods[0]), addr, e3)
		dumpSays(t, c, n1, "default/near-zone", "zone hints for "+n1.Zone)

		// No endpoint in zone-a: all of them serve node-1.
		setHinted(t, c, svc, e3, n3.Pods[0])
		answeredBy(t, from(n1.Pods[0]), addr, e3, n3.Pods[0])
		dumpSays(t, c, n1, "default/near-zone", "none: no endpoint hinted for zone "+n1.Zone)
	})

	// External traffic under the Cluster policy is narrowed as cluster-IP
	// traffic is, on the node it arrives at. Under the Local policy it
	// reaches that node's endpoints, hints aside, while pods (and the
	// node) reaching the node port go to the Cluster endpoints, narrowed.
	t.Run("NodePort", func(t *testing.T) {
		ctx := ctxFor(t)
		svc := distributed(t, c, "near-np", v1.ServiceTypeNodePort, v1.ServiceTrafficDistributionPreferSameZone)
		client := asker{"the external client", c.ClientNetns}
		np := svc.Spec.Ports[0].NodePort
		setHinted(t, c, svc, e1, e2, e3)
		answeredBy(t, client, hostPort(n1.IP, np), e1, e2)
		answeredBy(t, client, hostPort(n3.IP, np), e3)
		dumpSays(t, c, n1, "default/near-np", "zone hints for "+n1.Zone)

		cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		if _, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		answeredBy(t, client, hostPort(n1.IP, np), e1)
		answeredBy(t, from(n1.Pods[0]), hostPort(n1.IP, np), e1, e2)
		dumpSays(t, c, n1, "default/near-np", "zone hints for "+n1.Zone)
	})
}

// setZone moves node n to zone, in its Node object (as an operator's
// relabelling would) and in the harness, which writes endpoints' zones.
func setZone(t *testing.T, c *netns.Cluster, n *netns.Node, zone string) {
	t.Helper()
	ctx := ctxFor(t)
	node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels[v1.LabelTopologyZone] = zone
	if _, err := c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Zone = zone
}

// distributed creates a Service of type typ with trafficDistribution td,
// without endpoints yet.
func distributed(t *testing.T, c *netns.Cluster, name string, typ v1.ServiceType, td string) *v1.Service {
	t.Helper()
	svc := service(name, typ, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	svc.Spec.TrafficDistribution = ptr.To(td)
	created, _ := expose(t, c, svc, nil)
	return created
}

// setHinted makes pods svc's ready endpoints and gives each the hints the
// EndpointSlice controller (k8s.io/endpointslice/trafficdist) gives a
// ready endpoint of a Service with svc's trafficDistribution: its own
// zone, and for PreferSameNode its own node too.
func setHinted(t *testing.T, c *netns.Cluster, svc *v1.Service, pods ...*netns.Pod) {
	t.Helper()
	ctx := ctxFor(t)
	if err := c.SetEndpoints(ctx, svc, netns.Ready(pods...)); err != nil {
		t.Fatalf("endpoints of %s: %v", svc.Name, err)
	}
	slices := c.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	list, err := slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		t.Fatal(err)
	}
	sameNode := *svc.Spec.TrafficDistribution == v1.ServiceTrafficDistributionPreferSameNode
	for _, s := range list.Items {
		for i := range s.Endpoints {
			ep := &s.Endpoints[i]
			if ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
				continue
			}
			h := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: *ep.Zone}}}
			if sameNode {
				h.ForNodes = []discoveryv1.ForNode{{Name: *ep.NodeName}}
			}
			ep.Hints = h
		}
		if _, err := slices.Update(ctx, &s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// asker is where requests come from: a pod, or the external client.
type asker struct{ name, netns string }

func from(p *netns.Pod) asker { return asker{p.Name + " on " + p.Node.Name, p.Netns} }

// answeredBy waits until who's requests to addr are answered by want
// alone, every one of them (the agent has the new hints), then sends
// trafficDistributionRequests more: each must come from want, and each
// of want must answer one.
func answeredBy(t *testing.T, who asker, addr string, want ...*netns.Pod) {
	t.Helper()
	ctx := ctxFor(t)
	if _, err := netns.WaitBackends(ctx, who.netns, "tcp", addr, want, time.Now()); err != nil {
		t.Fatalf("from %s: %v", who.name, err)
	}
	got := map[string]int{}
	for i := 0; i < trafficDistributionRequests; i++ {
		rep, err := nsutil.Request(ctx, who.netns, "tcp", addr)
		if err != nil {
			t.Fatalf("from %s: %v", who.name, err)
		}
		got[rep.Name]++
	}
	n := 0
	for _, p := range want {
		if got[p.Name] == 0 {
			t.Errorf("from %s to %s: %s never answered: %v", who.name, addr, p.Name, got)
		}
		n += got[p.Name]
	}
	if n != trafficDistributionRequests {
		t.Errorf("from %s to %s: %d of %d answers from %s: %v", who.name, addr, n, trafficDistributionRequests, podNames(want), got)
	}
}

// dumpSays checks that `agent dump-rules` on node n gives each port of
// service (namespace/name) the topology line want.
func dumpSays(t *testing.T, c *netns.Cluster, n *netns.Node, service, want string) {
	t.Helper()
	out, err := c.DumpRules(ctxFor(t), n, "table")
	if err != nil {
		t.Fatal(err)
	}
	block, ok := dumpBlock(out, service+":")
	if !ok {
		t.Fatalf("%s dump-rules has no %s:\n%s", n.Name, service, out)
	}
	if got := topologyLine(block); got != want {
		t.Errorf("%s dump-rules for %s: topology %q, want %q:\n%s", n.Name, service, got, want, block)
	}
}

// dumpBlock returns the table block of the first port whose name starts
// with prefix.
func dumpBlock(out, prefix string) (string, bool) {
	for _, b := range strings.Split(out, "\n\n") {
		if strings.HasPrefix(b, prefix) {
			return b, true
		}
	}
	return "", false
}

// topologyLine returns what a dump-rules block says after "topology".
func topologyLine(block string) string {
	for _, l := range strings.Split(block, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "topology "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
