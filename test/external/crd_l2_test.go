package external

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

// TestCRDL2Advertisement: a split install with crds on, whose file gives
// only the L2 lease timing. An L2Advertisement whose nodeSelector picks
// the node l2.Owner would not choose makes that node alone answer for the
// Service's address (on the interface its pattern matches); one with a
// bad pattern is Invalid and changes nothing; widened to every node, the
// advertisement moves the address to its owner among both, without a
// restart.
func TestCRDL2Advertisement(t *testing.T) {
	lab := newL2Lab(t)
	cp, c := lab.twoNodeCluster("sw")
	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	picked := map[string]string{"node1": "node2", "node2": "node1"}[owner]
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), picked, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"l2":"on"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{CRDs: true, L2: &l2.Config{LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5}})
	sp.runController(cfg, "onehop-controller-0", "")
	for _, n := range []string{"node1", "node2"} {
		sp.startNodeAgent(lab, n, cfg)
	}
	cr.apply(v1alpha1.LoadBalancerIPPools, "lab", `{addresses: ["`+vip+`"]}`)
	cr.apply(v1alpha1.L2Advertisements, "edge", `{ipAddressPools: [lab], interfacePattern: "eth[0-9]", nodeSelectors: [{matchLabels: {l2: "on"}}]}`)
	cr.accepted(v1alpha1.L2Advertisements, "edge", "True", "in force")
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	reach := func(what, node string) {
		t.Helper()
		var got string
		if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
			got, _ = lab.get("client", vip+":80")
			return got == pod[node] && lab.neigh(vip) == lab.mac(node, "eth0")
		}); !ok {
			t.Fatalf("%s: client -> %s: %q via %s, want %s via %s's %s", what, vip, got, lab.neigh(vip), pod[node], node, lab.mac(node, "eth0"))
		}
	}
	reach("the advertisement picks "+picked+" alone", picked)

	cr.apply(v1alpha1.L2Advertisements, "broken", `{interfacePattern: "eth("}`)
	cr.accepted(v1alpha1.L2Advertisements, "broken", "False", "interfacePattern")

	cr.apply(v1alpha1.L2Advertisements, "edge", `{ipAddressPools: [lab], interfacePattern: "eth[0-9]"}`)
	cr.accepted(v1alpha1.L2Advertisements, "edge", "True", "in force")
	reach("the advertisement picks both nodes", owner)
}
