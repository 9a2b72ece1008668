package external

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/nft"
	"github.com/onehop/onehop/portal"
)

// TestPodPoolOfOneNamespaceRefusesOtherPods: a pool with allowPods is
// limited to namespace payments. A Pod in default on node1 asks for one of
// its addresses: it gets an ExternalIPNotAllowed event, node1's nft
// dataplane holds nothing for the address, the router never learns a route
// to it (sampled all along) and a client cannot reach the Pod through it.
// A Pod of payments on node2 gets its address: the router routes it to
// node2, whose nft dataplane DNATs the client's request to the pod. A
// second Pod of payments, on node1 and created last, is the sign that
// node1 has followed the grants written after the controller saw the
// first two. Split install as deploy/ ships it, under its RBAC; each node
// agent runs the real nft dataplane in its namespace.
func TestPodPoolOfOneNamespaceRefusesOtherPods(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "payments"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const (
		intruderIP = "203.0.113.20" // asked for by a Pod of default
		apiIP      = "203.0.113.21" // payments' Pod on node2
		workerIP   = "203.0.113.22" // payments' Pod on node1, created last
	)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "payments-pods", Addresses: []string{"203.0.113.16/28"},
			AllowPods: true, Namespaces: []string{"payments"}}},
		PodExternalIPs: true,
		BGP:            &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
	})
	sp.runController(cfg, "onehop-controller-0", "node1")
	t.Setenv("OHX_MODEL", "1")
	t.Setenv("OHX_NFT", "1")
	for _, n := range []string{"node1", "node2"} {
		sp.startNodeAgent(lab.topo, n, cfg)
	}

	// From here on the router must never have a route to the intruder's
	// address.
	stopSampling := lab.sampleHops(t, intruderIP)

	claimPod(t, c, "default", "intruder", "node1", intruderIP, "10.244.1.2")
	claimPod(t, c, "payments", "api", "node2", apiIP, "10.244.2.2")
	lab.waitHopsFor(t, apiIP, "payments/api's address, from node2", "10.0.0.12")
	claimPod(t, c, "payments", "worker", "node1", workerIP, "10.244.1.3")
	lab.waitHopsFor(t, workerIP, "payments/worker's address, from node1", "10.0.0.11")

	// Packets: payments' address reaches its pod through node2's DNAT; the
	// intruder's address reaches nothing.
	for i := range 5 {
		if got, err := lab.get("client", apiIP+":8080"); err != nil || got != "pod2" {
			t.Errorf("request %d to %s: %q, %v; want payments/api's pod (pod2)", i, apiIP, got, err)
		}
	}
	if got, err := lab.get("client", intruderIP+":8080"); err == nil {
		t.Errorf("request to %s reached %q; want no answer", intruderIP, got)
	}
	rules := map[string]string{}
	for _, n := range []string{"node1", "node2"} {
		rules[n] = lab.exec(n, "nft", "list", "table", "inet", nft.TableName)
	}
	if !strings.Contains(rules["node2"], apiIP) {
		t.Errorf("node2's dataplane does not map %s:\n%s", apiIP, rules["node2"])
	}
	if !strings.Contains(rules["node1"], workerIP) {
		t.Errorf("node1's dataplane does not map %s:\n%s", workerIP, rules["node1"])
	}
	for n, r := range rules {
		if strings.Contains(r, intruderIP) {
			t.Errorf("%s's dataplane holds the intruder's %s:\n%s", n, intruderIP, r)
		}
	}
	cm, err := c.CoreV1().ConfigMaps(splitLeaseNamespace).Get(context.Background(), claims.GrantsConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g := cm.Data["grants"]; strings.Contains(g, intruderIP) || !strings.Contains(g, apiIP) || !strings.Contains(g, workerIP) {
		t.Errorf("grants %s: want payments' two addresses and not the intruder's", g)
	}

	if seen := stopSampling(); len(seen) != 1 || len(seen[0]) != 0 {
		t.Errorf("the router's next hops for %s, the address a Pod of default asked of payments' pool, were %v; want none throughout", intruderIP, seen)
	}
	msg := waitTenantEvent(t, c, "default", "Pod", "intruder", claims.ReasonExternalIPNotAllowed)
	t.Logf("default/intruder refused: %s", msg)
	if !strings.Contains(msg, "payments-pods") || !strings.Contains(msg, "default") {
		t.Errorf("the refusal %q should name the pool and the namespace it does not serve", msg)
	}
}

// nodeDataplane is what followModel applies each snapshot to before it
// reports the snapshot programmed, as cmd/agent's runner does: with
// OHX_NFT set, the real nft dataplane of the namespace the agent runs in
// (a node's: the lab's pods are 10.244.0.0/16); otherwise nothing. It
// reports whether the snapshot is in the kernel.
func nodeDataplane() func(ctx context.Context, snap *portal.Snapshot) bool {
	if os.Getenv("OHX_NFT") == "" {
		return func(context.Context, *portal.Snapshot) bool { return true }
	}
	dp := nft.New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	return func(ctx context.Context, snap *portal.Snapshot) bool {
		if _, err := dp.Sync(ctx, snap, true); err != nil {
			slog.Error("nft sync failed; nothing reported programmed", "err", err)
			return false
		}
		return true
	}
}
