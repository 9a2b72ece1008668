package external

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/portal"
)

// world is a small cluster for the registry: two nodes, pools and CIDRs.
type world struct {
	t     *testing.T
	cfg   *parsed
	reg   *registry
	nodes []*corev1.Node
	svcs  []*corev1.Service
	pods  []*corev1.Pod
	eps   []*discoveryv1.EndpointSlice
	clock time.Time
}

func newWorld(t *testing.T, c Config) *world {
	t.Helper()
	cfg, err := c.parse()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, cfg: cfg, reg: newRegistry(cfg), clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i, n := range []string{"node1", "node2"} {
		w.nodes = append(w.nodes, node(n, func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1" + string(rune('1'+i))}}
		}))
	}
	return w
}

// created hands out creation times, each later than the last.
func (w *world) created() metav1.Time {
	w.clock = w.clock.Add(time.Minute)
	return metav1.NewTime(w.clock)
}

func (w *world) service(ns, name string, mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name), CreationTimestamp: w.created()},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0." + string(rune('1'+len(w.svcs))),
			Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if mod != nil {
		mod(s)
	}
	w.svcs = append(w.svcs, s)
	return s
}

func (w *world) pod(ns, name, ip, node, podIP string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := pod(name, ip, w.created(), node, podIP)
	p.Namespace, p.UID = ns, types.UID("pod-"+ns+"/"+name)
	for _, m := range mod {
		m(p)
	}
	w.pods = append(w.pods, p)
	return p
}

// endpoints gives Service ns/name one ready endpoint on each node named.
func (w *world) endpoints(ns, name string, nodes ...string) {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}}
	ready := true
	for _, n := range nodes {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	w.eps = append(w.eps, es)
}

func (w *world) resolve() *ownership {
	return w.reg.resolve(registryInput{services: w.svcs, pods: w.pods, nodes: w.nodes})
}

// refusals maps "namespace/name" to the reasons of its refusals.
func refusalsOf(o *ownership) map[string][]string {
	out := map[string][]string{}
	for _, r := range o.refusals {
		k := r.obj.GetNamespace() + "/" + r.obj.GetName()
		out[k] = append(out[k], r.reason)
	}
	return out
}

func (w *world) state(node string, own *ownership, prog map[served]programmed) *State {
	return &State{Node: node, Targets: targets(targetInput{services: w.svcs, slices: w.eps, nodes: w.nodes, own: own}), programmed: prog}
}

func lb(ip string, local bool) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		if ip != "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		}
	}
}

func externalIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func key(ns, name string) portal.ServiceKey { return portal.ServiceKey{Namespace: ns, Name: name} }

var (
	ipX = netip.MustParseAddr("192.0.2.1")
	ipE = netip.MustParseAddr("198.51.100.7")
)

func poolsAndCIDRs() Config {
	return Config{
		Pools:           []PoolConfig{{Name: "main", Addresses: []string{"192.0.2.0/28"}}, {Name: "pods", Addresses: []string{"192.0.2.16/28"}, AllowPods: true}},
		ExternalIPCIDRs: []string{"198.51.100.0/24"},
	}
}

// The case of the report: team-a's Local Service holds X from a pool, its
// only pod on node2; team-b's Service lists X in spec.externalIPs with its
// pod on node1. Only node2 may announce X, whether X is outside
// externalIPCIDRs (the dataplane refuses it for team-b) or inside them.
func TestAnotherNamespaceCannotBlackHoleALoadBalancerIP(t *testing.T) {
	for _, inside := range []bool{false, true} {
		c := poolsAndCIDRs()
		if inside {
			c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/28")
		}
		w := newWorld(t, c)
		w.service("team-a", "web", lb(ipX.String(), true))
		w.endpoints("team-a", "web", "node2")
		w.service("team-b", "thief", externalIPs(ipX.String()))
		w.endpoints("team-b", "thief", "node1")
		own := w.resolve()

		if h := own.held[ipX]; h == nil || h.kind != heldByLoadBalancer || !slices.Equal(h.services, []portal.ServiceKey{key("team-a", "web")}) {
			t.Fatalf("inside=%v: X held by %+v, want team-a/web's allocation", inside, h)
		}
		want := ReasonExternalIPNotAllowed
		if inside {
			want = ReasonExternalIPConflict
		}
		if r := refusalsOf(own)["team-b/thief"]; !slices.Equal(r, []string{want}) {
			t.Errorf("inside=%v: team-b/thief refusals %v, want [%s]", inside, r, want)
		}
		for _, r := range own.refusals {
			if strings.Contains(r.msg, "team-a") || strings.Contains(r.msg, "web") {
				t.Errorf("inside=%v: the refusal names the other team's Service: %q", inside, r.msg)
			}
		}
		// What each node's dataplane would hold: X for team-a/web (its LB
		// IP) on both nodes, with a local endpoint on node2 only; for
		// team-b/thief only when X is inside the CIDRs (and the portal
		// model does not take it from the holder, but assume the worst).
		prog := func(local bool) map[served]programmed {
			m := map[served]programmed{{ipX, key("team-a", "web")}: {anyEndpoint: true, localEndpoint: local}}
			if inside {
				m[served{ipX, key("team-b", "thief")}] = programmed{anyEndpoint: true, localEndpoint: !local}
			}
			return m
		}
		if w.state("node1", own, prog(false)).Serves(ipX) {
			t.Errorf("inside=%v: node1 announces X, where team-a/web has no endpoint", inside)
		}
		st2 := w.state("node2", own, prog(true))
		if !st2.Serves(ipX) {
			t.Errorf("inside=%v: node2 does not announce X", inside)
		}
		if e := st2.Eligible(ipX); !slices.Equal(e, []string{"node2"}) {
			t.Errorf("inside=%v: eligible for X %v, want [node2]", inside, e)
		}
	}
}

func TestExternalIPOwnership(t *testing.T) {
	c := poolsAndCIDRs()
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "10.0.0.0/8") // nodes' addresses and cluster IPs too
	w := newWorld(t, c)
	first := w.service("team-a", "first", externalIPs(ipE.String()))
	w.service("team-a", "second", func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{ipE.String()}
		s.Spec.Ports[0].Port = 443
	})
	w.service("team-b", "later", externalIPs(ipE.String(), "10.0.0.11", "10.96.0.1", "not-an-ip"))
	own := w.resolve()
	if h := own.held[ipE]; h == nil || h.kind != heldByExternalIP || !slices.Equal(h.services, []portal.ServiceKey{key("team-a", "first"), key("team-a", "second")}) {
		t.Fatalf("E held by %+v, want team-a's two Services", h)
	}
	// The node's address is served in place and announced by nobody; the
	// cluster IP of another Service and another namespace's IP are refused.
	got := refusalsOf(own)["team-b/later"]
	slices.Sort(got)
	want := []string{ReasonExternalIPConflict, ReasonExternalIPConflict, ReasonExternalIPNotAllowed}
	if !slices.Equal(got, want) {
		t.Errorf("team-b/later refusals %v, want %v", got, want)
	}
	if len(own.external[key("team-b", "later")]) != 0 {
		t.Errorf("team-b/later holds %v", own.external[key("team-b", "later")])
	}
	// What the dataplane must not serve: team-b's claim on E and on the
	// cluster IP, not the node's address (served in place), not the
	// address outside the CIDRs (the model refuses it itself).
	wantRefused := map[portal.ServiceKey][]netip.Addr{key("team-b", "later"): {netip.MustParseAddr("10.96.0.1"), ipE}}
	if got := own.refusedExternal(); !maps.EqualFunc(got, wantRefused, slices.Equal) {
		t.Errorf("refused external IPs %v, want %v", got, wantRefused)
	}

	// An older Service of team-b now lists E too. The controller recorded
	// E as team-a's (externalGrantsOf, what it writes): team-a keeps E on
	// every agent, one that has run all along and one that just started.
	old := w.service("team-b", "old", externalIPs(ipE.String()))
	old.CreationTimestamp = metav1.NewTime(first.CreationTimestamp.Add(-time.Hour))
	granted, err := decodeExternalGrants(&corev1.ConfigMap{Data: map[string]string{externalKey: externalGrantsOf(own)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[netip.Addr]string{ipE: "team-a"}; !maps.Equal(granted, want) {
		t.Fatalf("grants %v, want %v", granted, want)
	}
	for i, r := range []*registry{w.reg, newRegistry(w.cfg)} {
		own = r.resolve(registryInput{services: w.svcs, nodes: w.nodes, external: granted})
		if h := own.held[ipE]; h.namespace != "team-a" {
			t.Errorf("agent %d: an older Service edited to list E took it from its holder: %+v", i, h)
		}
		if r := refusalsOf(own)["team-b/old"]; !slices.Equal(r, []string{ReasonExternalIPConflict}) {
			t.Errorf("agent %d: team-b/old refusals %v", i, r)
		}
	}
	// Without a grant (no controller, or before it recorded the address)
	// the oldest claimant wins, on every agent alike: what an agent saw
	// before does not count.
	for i, r := range []*registry{w.reg, newRegistry(w.cfg)} {
		if h := r.resolve(registryInput{services: w.svcs, nodes: w.nodes}).held[ipE]; h.namespace != "team-b" {
			t.Errorf("agent %d without grants: E held by %+v, want the oldest claimant's namespace", i, h)
		}
	}
	// The holders let go: the next claimant gets E, though the grant still
	// names team-a.
	w.svcs = slices.DeleteFunc(w.svcs, func(s *corev1.Service) bool { return s.Namespace == "team-a" })
	if h := w.reg.resolve(registryInput{services: w.svcs, nodes: w.nodes, external: granted}).held[ipE]; h == nil || h.namespace != "team-b" || len(h.services) != 2 {
		t.Errorf("after team-a let go: E held by %+v, want team-b's Services", h)
	}
	// A grant that does not parse grants nothing.
	if _, err := decodeExternalGrants(&corev1.ConfigMap{Data: map[string]string{externalKey: "{"}}); err == nil {
		t.Error("an unreadable grant was read")
	}
}

func TestPodClaims(t *testing.T) {
	c := poolsAndCIDRs()
	w := newWorld(t, c)
	w.service("team-a", "web", lb(ipX.String(), false))
	w.service("team-a", "ext", externalIPs("198.51.100.8"))
	w.service("team-c", "foreign", func(s *corev1.Service) {
		lb("198.51.100.9", false)(s)
		class := "example.com/other"
		s.Spec.LoadBalancerClass = &class
	})
	hostNet := func(p *corev1.Pod) { p.Spec.HostNetwork = true }
	w.pod("team-b", "lb", ipX.String(), "node1", "10.244.1.2")              // a Service's LB IP (and not a pod pool)
	w.pod("team-b", "ext", "198.51.100.8", "node1", "10.244.1.3")           // a Service's external IP
	w.pod("team-b", "foreign", "198.51.100.9", "node1", "10.244.1.4")       // another controller's LB IP
	w.pod("team-b", "cluster", "10.96.0.1", "node1", "10.244.1.5")          // a cluster IP: not allowed anyway
	w.pod("team-b", "host", "198.51.100.20", "node1", "10.0.0.11", hostNet) // hostNetwork
	w.pod("team-b", "ok", "192.0.2.17", "node1", "10.244.1.6")              // a pod pool
	w.pod("team-b", "ok6", "198.51.100.21", "node2", "10.244.2.6")          // externalIPCIDRs
	own := w.resolve()
	want := map[string][]string{
		"team-b/lb":      {ReasonExternalIPNotAllowed},
		"team-b/ext":     {ReasonExternalIPConflict},
		"team-b/foreign": {ReasonExternalIPConflict},
		"team-b/cluster": {ReasonExternalIPNotAllowed},
		"team-b/host":    {ReasonExternalIPNotAllowed},
	}
	got := refusalsOf(own)
	for k, r := range want {
		if !slices.Equal(got[k], r) {
			t.Errorf("%s: refusals %v, want %v", k, got[k], r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("refusals %v, want %v", got, want)
	}
	var mapped []string
	for _, p := range own.pods {
		mapped = append(mapped, p.Pod.Name+"="+p.IP.String())
	}
	if !slices.Equal(mapped, []string{"ok=192.0.2.17", "ok6=198.51.100.21"}) {
		t.Errorf("mapped %v", mapped)
	}

	// With the LB pool's addresses and the nodes' inside externalIPCIDRs,
	// a Pod still cannot take a Service's LB IP or a node's address.
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/28", "10.0.0.0/24")
	w2 := newWorld(t, c)
	w2.service("team-a", "web", lb(ipX.String(), false))
	w2.pod("team-b", "lb", ipX.String(), "node1", "10.244.1.2")
	w2.pod("team-b", "node", "10.0.0.12", "node1", "10.244.1.3")
	own = w2.resolve()
	if r := refusalsOf(own); !slices.Equal(r["team-b/lb"], []string{ReasonExternalIPConflict}) || !slices.Equal(r["team-b/node"], []string{ReasonExternalIPConflict}) {
		t.Errorf("refusals %v", r)
	}
	if len(own.pods) != 0 {
		t.Errorf("mapped %v", own.pods)
	}

	// A Pod holding an address keeps it when a Service lists it later,
	// and the allocator is told the address is taken.
	w3 := newWorld(t, poolsAndCIDRs())
	w3.pod("team-b", "p", "198.51.100.30", "node1", "10.244.1.2")
	w3.resolve()
	svc := w3.service("team-a", "late", externalIPs("198.51.100.30"))
	svc.CreationTimestamp = metav1.NewTime(w3.clock.Add(-48 * time.Hour))
	own = w3.resolve()
	if len(own.pods) != 1 || !slices.Equal(refusalsOf(own)["team-a/late"], []string{ReasonExternalIPConflict}) {
		t.Errorf("pods %v, refusals %v: the Pod should keep its address", own.pods, refusalsOf(own))
	}
	if own.reserved(netip.MustParseAddr("198.51.100.30")) == "" || own.reserved(netip.MustParseAddr("10.0.0.11")) == "" || own.reserved(netip.MustParseAddr("10.96.0.1")) == "" {
		t.Error("a Pod's address, a node's or a cluster IP is not reserved for the allocator")
	}
}

func TestLoadBalancerHolders(t *testing.T) {
	c := poolsAndCIDRs()
	c.Pools = append(c.Pools, PoolConfig{Name: "team-a-only", Addresses: []string{"203.0.113.0/28"}, Namespaces: []string{"team-a"}})
	w := newWorld(t, c)
	shared := func(port int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			lb(ipX.String(), false)(s)
			s.Annotations = map[string]string{AnnotationAllowSharedIP: "k"}
			s.Spec.Ports[0].Port = port
		}
	}
	w.service("team-a", "a", shared(80))
	w.service("team-a", "b", shared(443))
	w.service("team-a", "unshared", lb(ipX.String(), false))   // a status edit by hand: younger, refused
	w.service("team-b", "squatter", lb("203.0.113.5", false))  // a pool team-b may not use
	w.service("team-b", "outside", lb("198.51.100.40", false)) // in no pool: kept (a pool shrank under it)
	w.service("team-b", "on-node", lb("10.0.0.11", false))     // a node's address
	w.endpoints("team-a", "a", "node1")
	w.endpoints("team-a", "b", "node1", "node2")
	own := w.resolve()
	if h := own.held[ipX]; h == nil || !slices.Equal(h.services, []portal.ServiceKey{key("team-a", "a"), key("team-a", "b")}) {
		t.Fatalf("X held by %+v", h)
	}
	if h := own.held[netip.MustParseAddr("198.51.100.40")]; h == nil || h.kind != heldByLoadBalancer || !slices.Equal(own.lb[key("team-b", "outside")], []netip.Addr{netip.MustParseAddr("198.51.100.40")}) {
		t.Errorf("an address outside every pool: held by %+v, team-b/outside holds %v", h, own.lb[key("team-b", "outside")])
	}
	for _, k := range []portal.ServiceKey{key("team-a", "unshared"), key("team-b", "squatter"), key("team-b", "on-node")} {
		if len(own.lb[k]) != 0 {
			t.Errorf("%s holds %v", k, own.lb[k])
		}
	}
	var ips []string
	for _, tg := range targets(targetInput{services: w.svcs, slices: w.eps, nodes: w.nodes, own: own}) {
		ips = append(ips, tg.IP.String()+"/"+tg.Service.Name)
	}
	if !slices.Equal(ips, []string{"192.0.2.1/a", "192.0.2.1/b", "198.51.100.40/outside"}) {
		t.Errorf("targets %v", ips)
	}
}

// A Service being deleted (a finalizer holds it) is served until it is
// gone, so it keeps its load-balancer, foreign load-balancer and external
// IPs against younger claims of another namespace, and stays announced.
func TestTerminatingServiceHoldsItsAddresses(t *testing.T) {
	c := poolsAndCIDRs()
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/24", "203.0.113.0/24") // so that only a holder refuses them
	w := newWorld(t, c)
	now := metav1.Now()
	terminating := func(mod func(*corev1.Service)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			mod(s)
			s.DeletionTimestamp, s.Finalizers = &now, []string{"example.com/hold"}
		}
	}
	foreign := "example.com/lb"
	w.service("team-a", "web", terminating(lb(ipX.String(), false)))
	w.service("team-a", "other", terminating(func(s *corev1.Service) {
		lb("203.0.113.9", false)(s)
		s.Spec.LoadBalancerClass = &foreign
	}))
	w.service("team-a", "ext", terminating(externalIPs(ipE.String())))
	w.service("team-b", "taker", func(s *corev1.Service) {
		lb("", false)(s)
		s.Spec.ExternalIPs = []string{ipX.String(), "203.0.113.9", ipE.String()}
	})
	w.endpoints("team-a", "web", "node1")
	w.endpoints("team-a", "ext", "node1")
	own := w.resolve()
	if !slices.Equal(own.lb[key("team-a", "web")], []netip.Addr{ipX}) || !slices.Equal(own.external[key("team-a", "ext")], []netip.Addr{ipE}) {
		t.Errorf("terminating Services hold %v and %v", own.lb[key("team-a", "web")], own.external[key("team-a", "ext")])
	}
	if h := own.held[netip.MustParseAddr("203.0.113.9")]; h == nil || h.kind != heldByForeignLB {
		t.Errorf("another controller's address of a terminating Service is held by %+v", h)
	}
	if got := refusalsOf(own)["team-b/taker"]; !slices.Equal(got, []string{ReasonExternalIPConflict, ReasonExternalIPConflict, ReasonExternalIPConflict}) {
		t.Errorf("team-b/taker's refusals %v, want all three of its external IPs refused as held", got)
	}
	var ips []string
	for _, tg := range targets(targetInput{services: w.svcs, slices: w.eps, nodes: w.nodes, own: own}) {
		ips = append(ips, tg.IP.String()+"/"+tg.Service.Name)
	}
	if !slices.Equal(ips, []string{"192.0.2.1/web", "198.51.100.7/ext"}) {
		t.Errorf("targets %v, want the terminating Services' addresses", ips)
	}
}
