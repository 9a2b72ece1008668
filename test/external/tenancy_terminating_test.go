package external

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
)

// TestTerminatingServiceKeepsItsAddress: team-a's Local-policy Service
// gets the VIP, its only pod on node1, and BIRD routes the VIP to node1.
// team-a puts a finalizer on the Service and deletes it: the Service is
// still served, as kube-proxy serves it, until it is gone from the API.
// team-b's Service, its pod on node2, then requests the VIP: it gets an
// IPConflict event and no address while team-a's Service exists, the
// router sends the VIP to node1 alone all along (sampled), and every
// request reaches team-a's pod. Once the finalizer is removed and team-a's
// Service is gone, team-b's gets the VIP, node2 announces it and requests
// reach team-b's pod. The hook runs split, as deploy/ ships it, with the
// node agents following their own model (OHX_MODEL).
func TestTerminatingServiceKeepsItsAddress(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	ctx := context.Background()
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const own = "203.0.113.11" // team-b's own address: the sign that everyone has seen what came before
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{
			{Name: "shared", Addresses: []string{vip}},
			{Name: "team-b", Addresses: []string{own}, Namespaces: []string{"team-b"}},
		},
		BGP: &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
	})
	sp.runController(cfg, "onehop-controller-0", "node1")
	t.Setenv("OHX_MODEL", "1")
	for _, n := range []string{"node1", "node2"} {
		sp.startNodeAgent(lab.topo, n, cfg)
	}

	local := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	createTenantService(t, c, tenantService("team-a", "web", 80, local))
	if ips := statusOf(t, c, "team-a", "web", some); !slices.Equal(ips, []string{vip}) {
		t.Fatalf("team-a/web got %v, want %s", ips, vip)
	}
	tenantEndpoints(t, c, "team-a", "web", map[string]string{"node1": "10.244.1.2"})
	lab.waitHops(t, "team-a/web announced by node1, where its pod is", "10.0.0.11")
	if got, err := lab.get("client", vip+":80"); err != nil || got != "pod1" {
		t.Fatalf("client -> %s: %q, %v; want team-a's pod (pod1)", vip, got, err)
	}

	// team-a holds its Service with a finalizer and deletes it.
	const finalizer = "test.onehop.io/hold"
	if _, err := c.CoreV1().Services("team-a").Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["`+finalizer+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Services("team-a").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if s, err := c.CoreV1().Services("team-a").Get(ctx, "web", metav1.GetOptions{}); err != nil || s.DeletionTimestamp == nil {
		t.Fatalf("team-a/web should be terminating: %v, %v", s, err)
	}

	// From here until team-a's Service is gone, the router must send the
	// VIP to node1 alone.
	stopSampling := lab.sampleHops(t, vip)

	createTenantService(t, c, tenantService("team-b", "taker", 80, func(s *corev1.Service) {
		local(s)
		s.Annotations = map[string]string{alloc.AnnotationLoadBalancerIPs: vip}
	}))
	tenantEndpoints(t, c, "team-b", "taker", map[string]string{"node2": "10.244.2.2"})
	msg := tenantEvent(t, c, "team-b", "taker", "IPConflict")
	if strings.Contains(msg, "web") || strings.Contains(msg, "team-a") {
		t.Errorf("the refusal names team-a's Service: %q", msg)
	}
	t.Logf("requested IP refused while team-a's Service terminates: %s", msg)

	// team-b's own Service, last: once it has its address and both nodes
	// announce it, the controller and both agents have seen all of the above.
	createTenantService(t, c, tenantService("team-b", "own", 80, func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }))
	if ips := statusOf(t, c, "team-b", "own", some); !slices.Equal(ips, []string{own}) {
		t.Fatalf("team-b/own got %v, want %s", ips, own)
	}
	tenantEndpoints(t, c, "team-b", "own", map[string]string{"node2": "10.244.2.2"})
	lab.waitHopsFor(t, own, "team-b's own Service, Cluster policy", "10.0.0.11", "10.0.0.12")

	if ips := currentStatus(t, c, "team-b", "taker"); len(ips) != 0 {
		t.Errorf("team-b/taker got %v while team-a's Service still exists", ips)
	}
	if ips := currentStatus(t, c, "team-a", "web"); !slices.Equal(ips, []string{vip}) {
		t.Errorf("terminating team-a/web now has %v, want %s", ips, vip)
	}
	for i := range 20 {
		if got, err := lab.get("client", vip+":80"); err != nil || got != "pod1" {
			t.Errorf("request %d to %s while team-a's Service terminates: %q, %v; want team-a's pod (pod1)", i, vip, got, err)
		}
	}
	seen := stopSampling()
	for _, hops := range seen {
		if !slices.Equal(hops, []string{"10.0.0.11"}) {
			t.Errorf("the router's next hops for %s were %v at some point while team-a's Service terminated (all seen: %v); want node1 alone throughout", vip, hops, seen)
			break
		}
	}
	t.Logf("router next hops for %s while team-a's Service terminated: %v", vip, seen)

	// team-a's Service goes: team-b's gets the VIP, and its pod the traffic.
	if _, err := c.CoreV1().Services("team-a").Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(ctx, 20*time.Second, func() bool {
		_, err := c.CoreV1().Services("team-a").Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); !ok {
		t.Fatal("team-a/web is not gone after its finalizer was removed")
	}
	if ips := statusOf(t, c, "team-b", "taker", some); !slices.Equal(ips, []string{vip}) {
		t.Fatalf("team-b/taker got %v once team-a's Service was gone, want %s", ips, vip)
	}
	lab.waitHops(t, "team-b/taker announced by node2, where its pod is", "10.0.0.12")
	for i := range 20 {
		if got, err := lab.get("client", vip+":80"); err != nil || got != "pod2" {
			t.Errorf("request %d to %s once team-a's Service was gone: %q, %v; want team-b's pod (pod2)", i, vip, got, err)
		}
	}
}

// currentStatus is the Service's status IPs now.
func currentStatus(t *testing.T, c kubernetes.Interface, ns, name string) []string {
	t.Helper()
	s, err := c.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	return ips
}

// sampleHops records the router's next hops for ip every 20 ms, each
// change once, until the returned stop, which returns them.
func (lab *bgpLab) sampleHops(t *testing.T, ip string) (stop func() [][]string) {
	var seen [][]string
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if hops := lab.nextHopsFor(ip); len(seen) == 0 || !slices.Equal(seen[len(seen)-1], hops) {
				seen = append(seen, hops)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	end := sync.OnceFunc(func() { close(done); <-sampled })
	t.Cleanup(end)
	return func() [][]string { end(); return seen }
}
