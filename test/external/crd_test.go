package external

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/test/cluster"
)

// crds is a test's access to the onehop.io custom resources of a control
// plane that has them installed.
type crds struct {
	t   *testing.T
	dyn dynamic.Interface
}

func installCRDs(t *testing.T, cp *cluster.ControlPlane) *crds {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return &crds{t: t, dyn: dyn}
}

func crdKind(gvr schema.GroupVersionResource) string {
	switch gvr {
	case v1alpha1.LoadBalancerIPPools:
		return "LoadBalancerIPPool"
	case v1alpha1.BGPPeers:
		return "BGPPeer"
	case v1alpha1.BGPAdvertisements:
		return "BGPAdvertisement"
	case v1alpha1.LoadBalancerWebhooks:
		return "LoadBalancerWebhook"
	}
	return "L2Advertisement"
}

// apply creates the object of gvr named name with spec (YAML), or
// replaces the spec of the one there.
func (c *crds) apply(gvr schema.GroupVersionResource, name, spec string) {
	c.t.Helper()
	ctx := context.Background()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		c.t.Fatalf("spec of %s: %v", name, err)
	}
	u, err := c.dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		u = &unstructured.Unstructured{Object: map[string]any{"spec": s}}
		u.SetAPIVersion(v1alpha1.GroupVersion.String())
		u.SetKind(crdKind(gvr))
		u.SetName(name)
		_, err = c.dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	} else if err == nil {
		u.Object["spec"] = s
		_, err = c.dyn.Resource(gvr).Update(ctx, u, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatalf("apply %s %s: %v", crdKind(gvr), name, err)
	}
}

// accepted waits until the object's Accepted condition, for its current
// generation, has status want and a message containing msg, and returns
// the object.
func (c *crds) accepted(gvr schema.GroupVersionResource, name, want, msg string) *unstructured.Unstructured {
	c.t.Helper()
	var u *unstructured.Unstructured
	var got string
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		var err error
		if u, err = c.dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			got = err.Error()
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, x := range conds {
			m, _ := x.(map[string]any)
			if m["type"] != v1alpha1.ConditionAccepted {
				continue
			}
			gen, _, _ := unstructured.NestedInt64(m, "observedGeneration")
			got = fmt.Sprintf("%v (%v) at generation %d: %v", m["status"], m["reason"], gen, m["message"])
			return m["status"] == want && gen == u.GetGeneration() && strings.Contains(fmt.Sprint(m["message"]), msg)
		}
		got = "no Accepted condition"
		return false
	})
	if !ok {
		c.t.Fatalf("%s %s: Accepted %s, want %s with %q", crdKind(gvr), name, got, want, msg)
	}
	return u
}

// poolCounts waits until the pool's status says used and free addresses.
func (c *crds) poolCounts(name string, used, free int64) {
	c.t.Helper()
	var u, f int64
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		o, err := c.dyn.Resource(v1alpha1.LoadBalancerIPPools).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		u, _, _ = unstructured.NestedInt64(o.Object, "status", "used")
		f, _, _ = unstructured.NestedInt64(o.Object, "status", "free")
		return u == used && f == free
	})
	if !ok {
		c.t.Fatalf("pool %s: used %d free %d, want %d and %d", name, u, f, used, free)
	}
}

// crdController starts a control plane with the custom resources
// installed and the controller of a split install on them, under
// deploy/base's RBAC, with crds on and no pool in its file.
func crdController(t *testing.T, name string) (kubernetes.Interface, *crds) {
	t.Helper()
	cp, _ := cluster.StartTest(t, name, "192.0.2.5")
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	sp.runController(sp.config(config.Config{CRDs: true}), "onehop-controller-0", "")
	return c, cr
}

// TestCRDPoolsLiveReload: the controller of a split install, under
// deploy/base's RBAC, with crds on and no pool in its file. A pool created
// as a custom resource hands out a LoadBalancer IP and reports it in its
// status; widening it changes nothing for the Service that holds an
// address; a pool overlapping an older one, and a pool change that makes
// an accepted pool invalid, are reported Invalid while the last good
// configuration keeps serving (a new Service still gets an address of the
// invalid pool's last good version); a valid change applies again, and a
// deleted pool serves no new Service (those holding its addresses keep them).
func TestCRDPoolsLiveReload(t *testing.T) {
	c, cr := crdController(t, "crdpool")
	pools := v1alpha1.LoadBalancerIPPools

	cr.apply(pools, "main", `{addresses: ["203.0.113.0/30"]}`) // .1 and .2 (network and broadcast skipped)
	cr.accepted(pools, "main", "True", "in force")
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation from a pool resource", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("web got %v, want 203.0.113.1", ips)
	}
	cr.poolCounts("main", 1, 1)

	cr.apply(pools, "main", `{addresses: ["203.0.113.0/29"]}`)
	cr.accepted(pools, "main", "True", "in force")
	cr.poolCounts("main", 1, 5)
	if ips := lbIPs(t, c, "web", "pool widened", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("widening the pool moved web to %v", ips)
	}

	// A newer pool over the same addresses is refused; the older stands.
	cr.apply(pools, "shadow", `{addresses: ["203.0.113.4-203.0.113.9"]}`)
	cr.accepted(pools, "shadow", "False", "overlap")
	cr.accepted(pools, "main", "True", "in force")

	// main turns invalid (a selector operator the schema lets through):
	// its last good version keeps serving, and says so.
	cr.apply(pools, "main", `{addresses: ["203.0.113.0/29"], namespaces: [default],
		serviceSelectors: [{matchExpressions: [{key: tier, operator: Sometimes, values: [a]}]}]}`)
	cr.accepted(pools, "main", "False", "last accepted version stays in force")
	createLB(t, c, "web2", 81)
	if ips := lbIPs(t, c, "web2", "allocation from the last good pool", some); !slices.Equal(ips, []string{"203.0.113.2"}) {
		t.Fatalf("web2 got %v, want 203.0.113.2 of main's last good version", ips)
	}
	if ips := lbIPs(t, c, "web", "main invalid", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("an invalid change moved web to %v", ips)
	}

	// A valid change applies again: main serves another namespace alone,
	// so web and web2 are served by no pool (they wait, with an event, and
	// main counts no address used).
	cr.apply(pools, "main", `{addresses: ["203.0.113.0/29"], namespaces: [payments]}`)
	cr.accepted(pools, "main", "True", "in force")
	event(t, c, "web", "AllocationFailed")
	cr.poolCounts("main", 0, 6)

	// With main shrunk, shadow no longer overlaps it: it is accepted and
	// serves the waiting Services.
	cr.apply(pools, "main", `{addresses: ["203.0.113.0/30"], namespaces: [payments]}`)
	cr.accepted(pools, "shadow", "True", "in force")
	inShadow := func(ips []string) bool {
		return len(ips) == 1 && slices.Contains([]string{"203.0.113.4", "203.0.113.5", "203.0.113.6", "203.0.113.7", "203.0.113.8", "203.0.113.9"}, ips[0])
	}
	lbIPs(t, c, "web", "shadow accepted", inShadow)
	lbIPs(t, c, "web2", "shadow accepted", inShadow)
	cr.poolCounts("shadow", 2, 4)

	// Deleted, shadow serves nobody new: web keeps its address, now in no
	// pool, and is told so; a new Service gets none.
	webIP := lbIPs(t, c, "web", "shadow serving", inShadow)
	if err := cr.dyn.Resource(pools).Delete(context.Background(), "shadow", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventSaying(t, c, "default", "web", "IPOutsidePools", webIP[0], "outside every address pool")
	if ips := lbIPs(t, c, "web", "shadow deleted", some); !slices.Equal(ips, webIP) {
		t.Fatalf("deleting shadow moved web from %v to %v", webIP, ips)
	}
	createLB(t, c, "web3", 82)
	event(t, c, "web3", "AllocationFailed")
	lbIPs(t, c, "web3", "shadow deleted", none)
	checkNoDoubleAllocation(t, c)
}

// outsideEvents counts the IPOutsidePools events on default/name, repeats
// included.
func outsideEvents(t *testing.T, c kubernetes.Interface, name string) int32 {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range evs.Items {
		if e.Reason == "IPOutsidePools" {
			n += max(e.Count, 1)
			if e.Series != nil {
				n += e.Series.Count
			}
		}
	}
	return n
}

// TestCRDPoolShrinkKeepsAddresses: a LoadBalancerIPPool shrinks under a
// Service. The Service keeps its address (its status does not change) and
// gets one Warning event, not one at every resync or pool change; the
// pool counts only its own addresses; new Services get addresses of the
// shrunk range, never the one held outside it.
func TestCRDPoolShrinkKeepsAddresses(t *testing.T) {
	c, cr := crdController(t, "crdshrink")
	pools := v1alpha1.LoadBalancerIPPools

	cr.apply(pools, "main", `{addresses: ["203.0.113.1-203.0.113.4"]}`)
	cr.accepted(pools, "main", "True", "in force")
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("web got %v, want 203.0.113.1", ips)
	}
	createLB(t, c, "web2", 81)
	if ips := lbIPs(t, c, "web2", "allocation", some); !slices.Equal(ips, []string{"203.0.113.2"}) {
		t.Fatalf("web2 got %v, want 203.0.113.2", ips)
	}
	cr.poolCounts("main", 2, 2)

	// main loses .1, which web holds.
	cr.apply(pools, "main", `{addresses: ["203.0.113.2-203.0.113.4"]}`)
	cr.accepted(pools, "main", "True", "in force")
	eventSaying(t, c, "default", "web", "IPOutsidePools", "203.0.113.1", "outside every address pool", "handed to no one else")
	if ips := lbIPs(t, c, "web", "main shrunk", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("shrinking main moved web to %v", ips)
	}
	cr.poolCounts("main", 1, 2)
	createLB(t, c, "web3", 82)
	if ips := lbIPs(t, c, "web3", "main shrunk", some); !slices.Equal(ips, []string{"203.0.113.3"}) {
		t.Fatalf("web3 got %v, want 203.0.113.3 of the shrunk range", ips)
	}
	createLB(t, c, "web4", 83)
	if ips := lbIPs(t, c, "web4", "main shrunk", some); !slices.Equal(ips, []string{"203.0.113.4"}) {
		t.Fatalf("web4 got %v, want 203.0.113.4 of the shrunk range", ips)
	}
	createLB(t, c, "web5", 84)
	event(t, c, "web5", "AllocationFailed")
	lbIPs(t, c, "web5", "main full", none)

	// Another pool change starts the allocator again: web is not told
	// twice, and its address stays its own.
	cr.apply(pools, "spare", `{addresses: ["198.51.100.10"], autoAssign: false}`)
	cr.accepted(pools, "spare", "True", "in force")
	createLB(t, c, "web6", 85, annotate(alloc.AnnotationAddressPool, "spare"))
	lbIPs(t, c, "web6", "spare", some)
	if n := outsideEvents(t, c, "web"); n != 1 {
		t.Errorf("web told %d times that its address is outside every pool, want once", n)
	}
	if ips := lbIPs(t, c, "web", "another pool change", some); !slices.Equal(ips, []string{"203.0.113.1"}) {
		t.Fatalf("another pool change moved web to %v", ips)
	}
	lbIPs(t, c, "web5", "main full", none)
	checkNoDoubleAllocation(t, c)
}
