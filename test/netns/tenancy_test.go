package netns_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestRefusedExternalIPIsNotServed: team-a's LoadBalancer IP is listed in
// team-b's spec.externalIPs, on another port, inside externalIPCIDRs (so
// the model alone would accept it). The cloud hook's registry gives the
// address to team-a, and the real agents (split install, node identity)
// then neither announce nor serve team-b's claim: the external client
// reaches team-a on port 80, and nothing of team-b's on 8080, on the node
// the address is routed to.
func TestRefusedExternalIPIsNotServed(t *testing.T) {
	c := newPodIPCluster(t)
	ctx := ctxFor(t)
	vip := netns.ExternalIP(20)
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RouteExternal(ctx, vip.String()+"/32", c.Nodes[0]); err != nil {
		t.Fatal(err)
	}
	teamA, teamB := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]

	web := service("web", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	web.Namespace = "team-a"
	created, _ := expose(t, c, web, []*netns.Pod{teamA})
	if _, err := c.SetLoadBalancerIngress(ctx, created, vip.String()); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	if _, err := netns.WaitBackends(ctx, c.ClientNetns, "tcp", hostPort(vip.String(), 80), []*netns.Pod{teamA}, since); err != nil {
		t.Fatal(err)
	}

	thief := service("thief", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 8080, netns.PortHTTP))
	thief.Namespace = "team-b"
	thief.Spec.ExternalIPs = []string{vip.String()}
	expose(t, c, thief, []*netns.Pod{teamB})
	// A Service of team-b's created after it, on an address of its own:
	// once it answers, the agents have seen the thief too.
	own := service("own", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 8080, netns.PortHTTP))
	own.Namespace = "team-b"
	own.Spec.ExternalIPs = []string{netns.ExternalIP(21).String()}
	if err := c.RouteExternal(ctx, netns.ExternalIP(21).String()+"/32", c.Nodes[0]); err != nil {
		t.Fatal(err)
	}
	_, since = expose(t, c, own, []*netns.Pod{teamB})
	if _, err := netns.WaitBackends(ctx, c.ClientNetns, "tcp", hostPort(netns.ExternalIP(21).String(), 8080), []*netns.Pod{teamB}, since); err != nil {
		t.Fatal(err)
	}
	// team-b's claim may be served for the moment the registry takes to
	// answer after the model has built it.
	d, err := netns.WaitUnserved(ctx, c.ClientNetns, "tcp", hostPort(vip.String(), 8080), since)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("team-b's claim unserved %v after the marker Service was written", d.Round(time.Millisecond))

	for i := range 20 {
		if rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", hostPort(vip.String(), 8080)); err == nil {
			t.Fatalf("request %d to %s:8080 was answered by %s: team-b serves on team-a's address", i, vip, rep.Name)
		}
		if rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", hostPort(vip.String(), 80)); err != nil || rep.Name != teamA.Name {
			t.Fatalf("request %d to %s:80: %q, %v; want team-a's pod %s", i, vip, rep.Name, err, teamA.Name)
		}
	}
}

// newPodIPCluster is a namespace cluster whose agents run the cloud hook's
// per-node part as deploy/ ships it (separateController) with pod external
// IPs on, so that each node's registry runs, and `agent controller` beside
// them with its own identity: it settles which Pod holds an external IP.
func newPodIPCluster(t *testing.T) *netns.Cluster {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "onehop.yaml")
	conf := fmt.Sprintf("apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\nexternal:\n  separateController: true\n  podExternalIPs: true\n  leaseNamespace: onehop-leases\n  externalIPCIDRs: [%q]\n", netns.ExternalCIDR)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	c := netns.NewForTest(t, netns.Config{AgentArgs: []string{"--config", cfg}})
	node := c.Nodes[0]
	id, err := c.CP.PodIdentity(ctxFor(t), cluster.AgentNamespace, cluster.ControllerServiceAccount, "onehop-controller-0", node.Name)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := nsutil.Start(node.Netns, "agent controller", filepath.Join(t.TempDir(), "controller.log"), nil,
		c.AgentArgs(node)[0], "controller", "--config", cfg, "--kubeconfig", id.Kubeconfig,
		"--identity", "onehop-controller-0", "--healthz-bind-address", "127.0.0.1:10258")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctl.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("=== agent controller log (tail):\n%s", ctl.Tail(3000))
		}
	})
	return c
}
