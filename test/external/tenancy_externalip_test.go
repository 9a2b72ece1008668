package external

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
)

// TestTenantExternalIPHolderSurvivesRestart: team-b's Service is the older
// object, but team-a's lists 203.0.113.30 in spec.externalIPs first; team-b
// then lists it too. team-b gets an ExternalIPConflict event, and node2's
// agent restarts (as a DaemonSet rollout restarts them one by one): every
// node, restarted or not, sends the address to team-a alone, by real
// packets sent to each node in turn. Once team-a's Service is gone,
// team-b gets the address on every node. Each Service has a pod behind
// each node (Local policy: a node sends to its own), answering as its
// team. Split install as deploy/ ships it, under its RBAC; each node agent
// runs the real nft dataplane in its namespace.
func TestTenantExternalIPHolderSurvivesRestart(t *testing.T) {
	externalIPHolderAcrossRestart(t, config.Config{
		ExternalIPCIDRs: []string{"203.0.113.0/24"},
		PodExternalIPs:  true,
		BGP:             &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
	})
}

// TestTenantExternalIPHolderWithoutProviders: the same with externalIPCIDRs
// alone in the hook's section, nothing to announce: the node agents still
// follow the controller on who holds each address.
func TestTenantExternalIPHolderWithoutProviders(t *testing.T) {
	externalIPHolderAcrossRestart(t, config.Config{ExternalIPCIDRs: []string{"203.0.113.0/24"}})
}

func externalIPHolderAcrossRestart(t *testing.T, base config.Config) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	for _, ns := range []string{"team-a", "team-b", "team-c"} {
		if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const (
		x = "203.0.113.30" // the address both teams ask for
		// Addresses of team-c's Services, created after each step: a node
		// that serves one has seen everything before it.
		mark1, mark2 = "203.0.113.31", "203.0.113.32"
	)
	// A probe on the nodes' segment sends each request to the node named.
	lab.add("probe")
	lab.veth("router", "vprobe", "probe", "eth0")
	lab.ip("router", "link", "set", "vprobe", "master", "br0")
	lab.ip("probe", "addr", "add", "10.0.0.50/24", "dev", "eth0")
	nodeAddr := map[string]string{"node1": "10.0.0.11", "node2": "10.0.0.12"}
	ask := func(node, ip string) (string, error) {
		lab.ip("probe", "route", "replace", ip+"/32", "via", nodeAddr[node])
		return lab.get("probe", ip+":80")
	}
	for _, pod := range []string{"pod1", "pod2"} {
		lab.serve(pod, ":8081", "team-a")
		lab.serve(pod, ":8082", "team-b")
		lab.serve(pod, ":8083", "team-c")
	}
	// waitAnswer waits until every node sends ip to want.
	waitAnswer := func(what, ip, want string) {
		t.Helper()
		for _, n := range []string{"node1", "node2"} {
			var got string
			var err error
			if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
				got, err = ask(n, ip)
				return err == nil && got == want
			}); !ok {
				t.Fatalf("%s: %s sends %s to %q (%v); want %s", what, n, ip, got, err, want)
			}
		}
	}

	sp := newSplit(t, cp)
	cfg := sp.config(base)
	sp.runController(cfg, "onehop-controller-0", "node1")
	t.Setenv("OHX_MODEL", "1")
	t.Setenv("OHX_NFT", "1")
	agents := map[string]*exec.Cmd{}
	for _, n := range []string{"node1", "node2"} {
		agents[n] = sp.startNodeAgent(lab.topo, n, cfg)
	}

	// team-b's Service comes first, without the address; team-a's lists it.
	older := tenantExternalService(t, c, "team-b", "b", 8082)
	// Creation times count seconds: team-a's must be a later one.
	time.Sleep(time.Until(older.CreationTimestamp.Add(1100 * time.Millisecond)))
	if a := tenantExternalService(t, c, "team-a", "a", 8081, x); !older.CreationTimestamp.Before(&a.CreationTimestamp) {
		t.Fatalf("team-b's Service was created %v, team-a's %v: the case needs team-b's to be older", older.CreationTimestamp, a.CreationTimestamp)
	}
	waitAnswer("team-a lists the address, alone", x, "team-a")
	// The controller records who holds it: from then on team-a does,
	// whatever object is older.
	waitGrant(t, c, x, "team-a")

	// team-b, the older object, lists it too: refused.
	setExternalIPs(t, c, "team-b", "b", x)
	msg := tenantEvent(t, c, "team-b", "b", claims.ReasonExternalIPConflict)
	if strings.Contains(msg, "team-a") {
		t.Errorf("the refusal names team-a: %q", msg)
	}
	t.Logf("team-b refused: %s", msg)
	tenantExternalService(t, c, "team-c", "mark1", 8083, mark1)
	waitAnswer("both nodes have seen team-b's claim", mark1, "team-c")
	waitAnswer("team-b's claim refused", x, "team-a")

	// node2's agent restarts, as in a rollout; node1's keeps running.
	_ = agents["node2"].Process.Signal(syscall.SIGTERM)
	if err := agents["node2"].Wait(); err != nil {
		t.Errorf("node2's agent exit after SIGTERM: %v", err)
	}
	sp.startNodeAgent(lab.topo, "node2", cfg)
	tenantExternalService(t, c, "team-c", "mark2", 8083, mark2)
	waitAnswer("node2's agent restarted", mark2, "team-c")
	for i := range 10 {
		for _, n := range []string{"node1", "node2"} {
			if got, err := ask(n, x); err != nil || got != "team-a" {
				t.Errorf("after node2's restart, request %d through %s to %s reached %q (%v); want team-a's pod", i, n, x, got, err)
			}
		}
	}
	if t.Failed() {
		return
	}

	// team-a lets go: team-b gets the address on every node.
	if err := c.CoreV1().Services("team-a").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAnswer("team-a's Service deleted", x, "team-b")
	waitGrant(t, c, x, "team-b")
}

// waitGrant waits until the controller's grants give ip to namespace ns.
func waitGrant(t *testing.T, c kubernetes.Interface, ip, ns string) {
	t.Helper()
	var data string
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		cm, err := c.CoreV1().ConfigMaps(splitLeaseNamespace).Get(context.Background(), claims.GrantsConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		data = cm.Data["externalIPs"]
		var gs []struct{ IP, Namespace string }
		return json.Unmarshal([]byte(data), &gs) == nil && slices.Contains(gs, struct{ IP, Namespace string }{ip, ns})
	}); !ok {
		t.Fatalf("the controller's external IP grants are %s; want %s granted to %s", data, ip, ns)
	}
}

// tenantExternalService creates a NodePort Service ns/name of Local policy
// on port 80 listing ips in spec.externalIPs, with one ready endpoint on
// each node (pod1 on node1, pod2 on node2) at targetPort; it returns the
// Service created.
func tenantExternalService(t *testing.T, c kubernetes.Interface, ns, name string, targetPort int32, ips ...string) *corev1.Service {
	t.Helper()
	svc, err := c.CoreV1().Services(ns).Create(context.Background(), tenantService(ns, name, 80, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.Ports[0].TargetPort = intstr.FromInt32(targetPort)
		s.Spec.ExternalIPs = ips
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := true
	port, proto, pname := targetPort, corev1.ProtocolTCP, ""
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for node, ip := range map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"} {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: new(node), Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}

// setExternalIPs makes ips the Service's spec.externalIPs.
func setExternalIPs(t *testing.T, c kubernetes.Interface, ns, name string, ips ...string) {
	t.Helper()
	s, err := c.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.ExternalIPs = ips
	if _, err := c.CoreV1().Services(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
