package external

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// TestTenantCannotTakeAnotherTenantsIP: team-a's Local-policy Service gets
// the VIP from a pool, its only pod on node2, and BIRD routes the VIP to
// node2 alone. team-b then tries every way to take, move or black-hole the
// VIP: spec.externalIPs (inside externalIPCIDRs, on another port, with its
// pod on node1, so that node1's own model programs it), a requested
// load-balancer IP, the same sharing key, and a Pod's onehop.io/external-ip.
// Each gets a refusal event; team-a's status keeps the VIP; the router
// never has node1 as a next hop for the VIP (sampled all along), and every
// client request reaches team-a's pod. team-b's own Service, created last,
// is the sign that both agents have seen all of it. The hook runs split, as
// deploy/ ships it: a controller and node agents, each under deploy/base's
// RBAC, and a refused request fails the test.
func TestTenantCannotTakeAnotherTenantsIP(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const own = "203.0.113.11" // team-b's own address, from a pool only team-b may use (team-a's VIP comes from a pool for all)
	cfg := config.Config{
		Pools: []config.PoolConfig{
			{Name: "shared", Addresses: []string{vip}},
			{Name: "team-b", Addresses: []string{own}, Namespaces: []string{"team-b"}},
		},
		// The pools lie inside the externalIPs range: the strongest case,
		// where the dataplane accepts team-b's spec.externalIPs entry.
		ExternalIPCIDRs: []string{"203.0.113.0/24"},
		PodExternalIPs:  true,
		BGP:             &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
	}
	// Installed as deploy/ ships it: one controller allocates and writes
	// status; the node agents only announce, under their own RBAC.
	sp := newSplit(t, cp)
	cfg = sp.config(cfg)
	sp.runController(cfg, "onehop-controller-0", "node1")
	t.Setenv("OHX_MODEL", "1")
	for _, n := range []string{"node1", "node2"} {
		sp.startNodeAgent(lab.topo, n, cfg)
	}

	web := tenantService("team-a", "web", 80, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Annotations = map[string]string{alloc.AnnotationAllowSharedIP: "shared"}
	})
	createTenantService(t, c, web)
	if ips := statusOf(t, c, "team-a", "web", some); !slices.Equal(ips, []string{vip}) {
		t.Fatalf("team-a/web got %v, want %s", ips, vip)
	}
	tenantEndpoints(t, c, "team-a", "web", map[string]string{"node2": "10.244.2.2"})
	lab.waitHops(t, "team-a/web announced by node2, where its pod is", "10.0.0.12")

	// From here on the router must never send the VIP to node1.
	var mu sync.Mutex
	var seen [][]string
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			hops := lab.nextHopsFor(vip)
			mu.Lock()
			if len(seen) == 0 || !slices.Equal(seen[len(seen)-1], hops) {
				seen = append(seen, hops)
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// spec.externalIPs, on a port team-a does not use, pod on node1.
	createTenantService(t, c, tenantService("team-b", "thief", 8080, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{vip} }))
	tenantEndpoints(t, c, "team-b", "thief", map[string]string{"node1": "10.244.1.2"})
	msg := tenantEvent(t, c, "team-b", "thief", claims.ReasonExternalIPConflict)
	if strings.Contains(msg, "web") || strings.Contains(msg, "team-a") {
		t.Errorf("the refusal names team-a's Service: %q", msg)
	}
	t.Logf("externalIPs refused: %s", msg)
	// A requested load-balancer IP.
	createTenantService(t, c, tenantService("team-b", "mover", 9090, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Annotations = map[string]string{alloc.AnnotationLoadBalancerIPs: vip}
	}))
	t.Logf("requested IP refused: %s", tenantEvent(t, c, "team-b", "mover", "IPConflict"))
	// The same sharing key, the same policy and selector, another port.
	createTenantService(t, c, tenantService("team-b", "joiner", 9091, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.Selector = map[string]string{"app": "web"}
		s.Annotations = map[string]string{alloc.AnnotationAllowSharedIP: "shared", alloc.AnnotationLoadBalancerIPs: vip}
	}))
	msg = tenantEvent(t, c, "team-b", "joiner", "IPConflict")
	if strings.Contains(msg, "web") || strings.Contains(msg, "team-a") {
		t.Errorf("the refusal names team-a's Service: %q", msg)
	}
	t.Logf("sharing key refused: %s", msg)
	// A Pod.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "squatter", Annotations: map[string]string{claims.AnnotationExternalIP: vip}},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	created, err := c.CoreV1().Pods("team-b").Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.2", PodIPs: []corev1.PodIP{{IP: "10.244.1.2"}}}
	if _, err := c.CoreV1().Pods("team-b").UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTenantEvent(t, c, "team-b", "Pod", "squatter", claims.ReasonExternalIPConflict)

	// team-b's own Service, last: once both nodes announce it, both agents
	// have seen everything above.
	createTenantService(t, c, tenantService("team-b", "own", 80, func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }))
	if ips := statusOf(t, c, "team-b", "own", some); !slices.Equal(ips, []string{own}) {
		t.Fatalf("team-b/own got %v, want %s", ips, own)
	}
	tenantEndpoints(t, c, "team-b", "own", map[string]string{"node1": "10.244.1.2"})
	lab.waitHopsFor(t, own, "team-b's own Service, Cluster policy", "10.0.0.11", "10.0.0.12")

	for i := range 20 {
		if got, err := lab.get("client", vip+":80"); err != nil || got != "pod2" {
			t.Errorf("request %d to %s: %q, %v; want team-a's pod (pod2)", i, vip, got, err)
		}
	}
	close(stop)
	<-sampled
	for _, hops := range seen {
		if !slices.Equal(hops, []string{"10.0.0.12"}) {
			t.Errorf("the router's next hops for %s were %v at some point (all seen: %v); want node2 alone throughout", vip, hops, seen)
			break
		}
	}
	if ips := statusOf(t, c, "team-a", "web", some); !slices.Equal(ips, []string{vip}) {
		t.Errorf("team-a/web now has %v", ips)
	}
	for _, name := range []string{"mover", "joiner"} {
		statusOf(t, c, "team-b", name, none)
	}
	t.Logf("router next hops for %s throughout: %v", vip, seen)
}

func tenantService(ns, name string, port int32, mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
	mod(s)
	return s
}

func createTenantService(t *testing.T, c kubernetes.Interface, s *corev1.Service) {
	t.Helper()
	if _, err := c.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// statusOf waits until cond holds for the Service's status IPs.
func statusOf(t *testing.T, c kubernetes.Interface, ns, name string, cond func([]string) bool) []string {
	t.Helper()
	var ips []string
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		s, err := c.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		ips = nil
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return cond(ips)
	}); !ok {
		t.Fatalf("service %s/%s has status IPs %v", ns, name, ips)
	}
	return ips
}

func tenantEvent(t *testing.T, c kubernetes.Interface, ns, name, reason string) string {
	t.Helper()
	return waitTenantEvent(t, c, ns, "Service", name, reason)
}

// waitTenantEvent waits for an event with reason on the named object.
func waitTenantEvent(t *testing.T, c kubernetes.Interface, ns, kind, name, reason string) string {
	t.Helper()
	var msg string
	var all []string
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		evs, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false
		}
		all = nil
		for _, e := range evs.Items {
			all = append(all, e.Reason+": "+e.Message)
			if e.Reason == reason && e.InvolvedObject.Kind == kind {
				msg = e.Message
				return true
			}
		}
		return false
	}); !ok {
		t.Fatalf("no %s event on %s %s/%s (events: %v)", reason, kind, ns, name, all)
	}
	return msg
}

// tenantEndpoints makes the Service's endpoints exactly one ready endpoint
// per node given (node -> pod IP).
func tenantEndpoints(t *testing.T, c kubernetes.Interface, ns, svc string, eps map[string]string) {
	t.Helper()
	ready := true
	port, proto, name := int32(8080), corev1.ProtocolTCP, ""
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for node, ip := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: new(node), Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// followModel runs portal's model of this node and tells h what the
// dataplane would hold after each change, as cmd/agent does after each sync.
// As there, the model leaves out the spec.externalIPs h's registry gives to
// someone else, and nothing is applied before the registry has answered.
// With OHX_FIRST_SYNC_AFTER set (a duration), the first sync waits that
// long, as the first sync of an agent in a large cluster does.
func followModel(ctx context.Context, h *external.Hook, c kubernetes.Interface, cfg config.Config, node string, watch *portal.ServiceWatch) error {
	pcfg := portal.Config{NodeName: node}
	for _, s := range cfg.ExternalIPCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return err
		}
		pcfg.ExternalIPCIDRs = append(pcfg.ExternalIPCIDRs, p)
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	tr := portal.NewTracker(pcfg, nil, poke)
	if _, err := (&portal.Informers{Client: c, NodeName: node, Watch: watch}).Start(ctx, tr); err != nil {
		return err
	}
	apply := nodeDataplane()
	go func() {
		if d, err := time.ParseDuration(os.Getenv("OHX_FIRST_SYNC_AFTER")); err == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		for {
			refused, answered := h.RefusedExternalIPs()
			if answered {
				tr.SetRefusedExternalIPs(refused)
			}
			var mine []portal.PodExternalIP
			for _, p := range h.PodExternalIPs() {
				if p.NodeName == node {
					mine = append(mine, portal.PodExternalIP{External: p.IP, Pod: p.PodIP, Name: p.Pod})
				}
			}
			tr.SetPodExternalIPs(mine)
			if snap, _ := tr.Snapshot(); answered && apply(ctx, snap) {
				h.Programmed(snap)
				var ips []netip.Addr
				for _, p := range snap.Node.PodExternalIPs {
					ips = append(ips, p.External)
				}
				h.ProgrammedPodIPs(ips)
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-h.PodsChanged():
			case <-h.RefusedExternalIPsChanged():
			}
		}
	}()
	return nil
}
