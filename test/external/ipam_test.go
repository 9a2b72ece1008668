package external

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/leases"
)

// TestIPAMAgainstAPIServer: two agents elect one allocator; requested IPs,
// pool choice, sharing, conflicts, bad annotations and exhaustion get
// answers or events; release on delete and type change; after the leader
// stops, the other rebuilds from status and never hands out a held IP.
// "split" runs the same with two `agent controller`s under deploy/base's
// RBAC, as deploy/ ships them, instead of two all-in-one agents as admin.
func TestIPAMAgainstAPIServer(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(map[bool]string{false: "all-in-one", true: "split"}[split], func(t *testing.T) { testIPAM(t, split) })
	}
}

func testIPAM(t *testing.T, split bool) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	cp, c := tp.startControlPlane("cp", "")
	cfg := ipamConfig()
	var stops map[string]func()
	if split {
		sp := newSplit(t, cp)
		cfg = sp.config(cfg)
		stops = map[string]func(){}
		for _, name := range []string{"onehop-controller-a", "onehop-controller-b"} {
			stops[name] = sp.runController(cfg, name, "")
		}
	} else {
		stops = map[string]func(){"n1": runHook(t, cfg, c, "n1"), "n2": runHook(t, cfg, c, "n2")}
	}

	createLB(t, c, "requested", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.3"))
	if ips := lbIPs(t, c, "requested", "requested IP", some); ips[0] != "192.0.2.3" {
		t.Fatalf("requested 192.0.2.3, got %v", ips)
	}
	createLB(t, c, "manual", 80, annotate(alloc.AnnotationAddressPool, "manual"))
	if ips := lbIPs(t, c, "manual", "pool choice", some); !strings.HasPrefix(ips[0], "198.51.100.") {
		t.Fatalf("pool manual: got %v", ips)
	}
	createLB(t, c, "share-a", 80, annotate(alloc.AnnotationAllowSharedIP, "k"))
	a := lbIPs(t, c, "share-a", "sharing", some)
	createLB(t, c, "share-b", 443, annotate(alloc.AnnotationAllowSharedIP, "k"))
	if b := lbIPs(t, c, "share-b", "sharing", some); b[0] != a[0] {
		t.Fatalf("share-b got %v, share-a %v: want one shared IP", b, a)
	}
	createLB(t, c, "conflict", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.3"))
	t.Logf("conflict event: %s", event(t, c, "conflict", "IPConflict"))
	createLB(t, c, "bad", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.300"))
	t.Logf("bad annotation event: %s", event(t, c, "bad", "BadAnnotation"))
	createLB(t, c, "plain", 80)
	lbIPs(t, c, "plain", "last free IP", some)
	createLB(t, c, "waiting", 80)
	t.Logf("exhaustion event: %s", event(t, c, "waiting", "AllocationFailed"))
	lbIPs(t, c, "conflict", "conflict stays without IP", none)
	checkNoDoubleAllocation(t, c)

	// Release on delete: the waiting Service gets the freed IP.
	plain := lbIPs(t, c, "plain", "before delete", some)
	if err := c.CoreV1().Services("default").Delete(context.Background(), "plain", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := lbIPs(t, c, "waiting", "release on delete", some); w[0] != plain[0] {
		t.Fatalf("waiting got %v, want the freed %v", w, plain)
	}
	// Release on type change: the status is cleared and the IP reused.
	// Another controller's status condition stays: the allocator writes
	// the ingress alone (a node agent's cache has no conditions).
	s, err := c.CoreV1().Services("default").Get(context.Background(), "requested", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Status.Conditions = []metav1.Condition{{Type: "example.com/Checked", Status: metav1.ConditionTrue, Reason: "Checked",
		LastTransitionTime: metav1.Now()}}
	if s, err = c.CoreV1().Services("default").UpdateStatus(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	if _, err := c.CoreV1().Services("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbIPs(t, c, "requested", "type change clears status", none)
	if s, err := c.CoreV1().Services("default").Get(context.Background(), "requested", metav1.GetOptions{}); err != nil || len(s.Status.Conditions) != 1 {
		t.Errorf("after the allocator cleared the status the conditions are %+v (%v); want the other controller's", s.Status.Conditions, err)
	}
	if ips := lbIPs(t, c, "conflict", "freed requested IP goes to the next asker", some); ips[0] != "192.0.2.3" {
		t.Fatalf("conflict got %v, want 192.0.2.3", ips)
	}
	before := checkNoDoubleAllocation(t, c)

	// Leader failover: whoever leads stops; the other must rebuild from
	// status before allocating, so the new Service gets no held IP.
	lease, err := c.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leader := *lease.Spec.HolderIdentity
	stops[leader]()
	if err := c.CoreV1().Services("default").Delete(context.Background(), "share-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createLB(t, c, "after-failover", 80, annotate(alloc.AnnotationAddressPool, "manual"))
	got := lbIPs(t, c, "after-failover", "allocation after failover", some)
	if l, err := c.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity == leader {
		t.Fatalf("after %s stopped the lease is held by %v (%v)", leader, l.Spec.HolderIdentity, err)
	}
	if len(before[got[0]]) > 0 {
		t.Fatalf("after failover %s was given to after-failover though %v hold it", got[0], before[got[0]])
	}
	after := checkNoDoubleAllocation(t, c)
	for ip, hs := range before {
		if hs[0] != "share-a" && len(after[ip]) == 0 {
			t.Errorf("after failover %s lost its holders %v", ip, hs)
		}
	}
	t.Logf("leader before failover: %s; allocations %v", leader, after)
}
