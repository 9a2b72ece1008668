package providers

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/internal/fakecluster"
	"github.com/onehop/onehop/external/internal/hooktest"
	"github.com/onehop/onehop/portal"
)

// state is what node is told when its dataplane programmed prog, over
// the world w and the registry's answer own.
func state(w *fakecluster.World, node string, own *claims.Ownership, prog map[Served]Programmed) *State {
	return &State{Node: node, Targets: targets(TargetInput{Services: w.Svcs, Slices: w.Eps, Nodes: w.Nodes, Own: own}), view: View{Programmed: prog}}
}

var (
	ipX = netip.MustParseAddr("192.0.2.1")
	ipE = netip.MustParseAddr("198.51.100.7")
)

func TestTargets(t *testing.T) {
	cfg, err := config.Config{Pools: []config.PoolConfig{{Name: "p", Addresses: []string{"192.0.2.0/28"}}}, ExternalIPCIDRs: []string{"198.51.100.0/24"}}.Parse()
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	other := "example.com/other"
	nodes := []*corev1.Node{
		hooktest.Node("a"), hooktest.Node("b"),
		hooktest.Node("cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }),
		hooktest.Node("notready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }),
		hooktest.Node("deleting", func(n *corev1.Node) { n.DeletionTimestamp = &now }),
		hooktest.Node("scaledown", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: taintToBeDeleted}} }),
		hooktest.Node("excluded", func(n *corev1.Node) { n.Labels = map[string]string{labelExcludeFromLB: ""} }),
	}
	ext := hooktest.LBService("ext", false)
	ext.Spec.Type = corev1.ServiceTypeClusterIP
	ext.Spec.ExternalIPs = []string{"198.51.100.7", "203.0.113.1"} // second one not allowed
	foreign := hooktest.LBService("foreign", false, "192.0.2.9")
	foreign.Spec.LoadBalancerClass = &other
	svcs := []*corev1.Service{
		hooktest.LBService("cluster", false, "192.0.2.1"),
		hooktest.LBService("local", true, "192.0.2.2"),
		hooktest.LBService("noeps", false, "192.0.2.3"),
		ext, foreign,
	}
	pods := []*corev1.Pod{hooktest.Pod("p", "198.51.100.50", metav1.Now(), "b", "10.244.1.5")}
	in := TargetInput{
		Nodes:    nodes,
		Services: svcs,
		Own:      claims.New(cfg).Resolve(claims.Input{Services: svcs, Nodes: nodes, Pods: pods}),
		Slices: []*discoveryv1.EndpointSlice{
			hooktest.Slice("cluster", map[string]bool{"a": true}),
			hooktest.Slice("local", map[string]bool{"b": true, "cordoned": true, "notready": true, "a": false}),
			hooktest.Slice("noeps", map[string]bool{"a": false}),
			hooktest.Slice("ext", map[string]bool{"b": true}),
			hooktest.Slice("foreign", map[string]bool{"b": true}),
		},
	}
	got := map[string][]string{}
	for _, tg := range targets(in) {
		got[tg.IP.String()] = tg.Nodes
	}
	want := map[string][]string{
		"192.0.2.1":     {"a", "b"},        // Cluster: every eligible node
		"192.0.2.2":     {"b", "cordoned"}, // Local: ready local endpoints on live nodes
		"192.0.2.3":     nil,               // no ready endpoint: nobody
		"198.51.100.7":  {"a", "b"},        // allowed spec.externalIPs
		"198.51.100.50": {"b"},             // pod external IP
	}
	if len(got) != len(want) {
		t.Errorf("targets %v, want %v", got, want)
	}
	for ip, w := range want {
		if g, ok := got[ip]; !ok || !slices.Equal(g, w) {
			t.Errorf("%s: nodes %v (present %v), want %v", ip, g, ok, w)
		}
	}
}

func TestStateServes(t *testing.T) {
	ip := netip.MustParseAddr("192.0.2.1")
	a, b := portal.ServiceKey{Namespace: "ns", Name: "a"}, portal.ServiceKey{Namespace: "ns", Name: "b"}
	st := func(local bool, nodes []string, prog map[Served]Programmed) *State {
		return &State{Node: "a", Targets: []Target{{IP: ip, Service: a, Local: local, Nodes: nodes}}, view: View{Programmed: prog}}
	}
	both := func(prog map[Served]Programmed) *State {
		return &State{Node: "a", Targets: []Target{{IP: ip, Service: a, Nodes: []string{"a", "b"}}, {IP: ip, Service: b, Nodes: []string{"a"}}}, view: View{Programmed: prog}}
	}
	for _, tc := range []struct {
		name  string
		s     *State
		serve bool
	}{
		{"eligible and programmed", st(false, []string{"a", "b"}, map[Served]Programmed{{ip, a}: {AnyEndpoint: true}}), true},
		{"not programmed yet", st(false, []string{"a"}, nil), false},
		{"programmed without endpoints", st(false, []string{"a"}, map[Served]Programmed{{ip, a}: {}}), false},
		{"programmed for another Service only", st(false, []string{"a"}, map[Served]Programmed{{ip, b}: {AnyEndpoint: true, LocalEndpoint: true}}), false},
		{"not eligible", st(false, []string{"b"}, map[Served]Programmed{{ip, a}: {AnyEndpoint: true}}), false},
		{"local without local endpoint in kernel", st(true, []string{"a"}, map[Served]Programmed{{ip, a}: {AnyEndpoint: true}}), false},
		{"local with local endpoint", st(true, []string{"a"}, map[Served]Programmed{{ip, a}: {AnyEndpoint: true, LocalEndpoint: true}}), true},
		{"shared: both holders programmed", both(map[Served]Programmed{{ip, a}: {AnyEndpoint: true}, {ip, b}: {AnyEndpoint: true}}), true},
		{"shared: one holder not programmed here", both(map[Served]Programmed{{ip, a}: {AnyEndpoint: true}}), false},
		{"pod IP not mapped here yet", &State{Node: "a", Targets: []Target{{IP: ip, Pod: true, Nodes: []string{"a"}}}}, false},
		{"pod IP mapped", &State{Node: "a", Targets: []Target{{IP: ip, Pod: true, Nodes: []string{"a"}}}, view: View{PodIPs: map[netip.Addr]bool{ip: true}}}, true},
		{"no target", &State{Node: "a", view: View{Programmed: map[Served]Programmed{{ip, a}: {AnyEndpoint: true}}}}, false},
	} {
		if got := tc.s.Serves(ip); got != tc.serve {
			t.Errorf("%s: Serves %v, want %v", tc.name, got, tc.serve)
		}
	}
	if got := both(nil).Eligible(ip); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Eligible of a shared IP: %v, want the nodes serving both Services [a]", got)
	}
}

// The case of the report: team-a's Local Service holds X from a pool, its
// only pod on node2; team-b's Service lists X in spec.externalIPs with its
// pod on node1. Only node2 may announce X, whether X is outside
// externalIPCIDRs (the dataplane refuses it for team-b) or inside them.
func TestAnotherNamespaceCannotBlackHoleALoadBalancerIP(t *testing.T) {
	for _, inside := range []bool{false, true} {
		c := fakecluster.PoolsAndCIDRs()
		if inside {
			c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/28")
		}
		w := fakecluster.NewWorld(t, c)
		w.Service("team-a", "web", fakecluster.LB(ipX.String(), true))
		w.Endpoints("team-a", "web", "node2")
		w.Service("team-b", "thief", fakecluster.ExternalIPs(ipX.String()))
		w.Endpoints("team-b", "thief", "node1")
		own := w.Resolve()

		if h := own.Held[ipX]; h == nil || h.Kind != claims.HeldByLoadBalancer || !slices.Equal(h.Services, []portal.ServiceKey{fakecluster.Key("team-a", "web")}) {
			t.Fatalf("inside=%v: X held by %+v, want team-a/web's allocation", inside, h)
		}
		want := claims.ReasonExternalIPNotAllowed
		if inside {
			want = claims.ReasonExternalIPConflict
		}
		if r := fakecluster.RefusalsOf(own)["team-b/thief"]; !slices.Equal(r, []string{want}) {
			t.Errorf("inside=%v: team-b/thief refusals %v, want [%s]", inside, r, want)
		}
		for _, r := range own.Refusals {
			if strings.Contains(r.Msg, "team-a") || strings.Contains(r.Msg, "web") {
				t.Errorf("inside=%v: the refusal names the other team's Service: %q", inside, r.Msg)
			}
		}
		// What each node's dataplane would hold: X for team-a/web (its LB
		// IP) on both nodes, with a local endpoint on node2 only; for
		// team-b/thief only when X is inside the CIDRs (and the portal
		// model does not take it from the holder, but assume the worst).
		prog := func(local bool) map[Served]Programmed {
			m := map[Served]Programmed{{ipX, fakecluster.Key("team-a", "web")}: {AnyEndpoint: true, LocalEndpoint: local}}
			if inside {
				m[Served{ipX, fakecluster.Key("team-b", "thief")}] = Programmed{AnyEndpoint: true, LocalEndpoint: !local}
			}
			return m
		}
		if state(w, "node1", own, prog(false)).Serves(ipX) {
			t.Errorf("inside=%v: node1 announces X, where team-a/web has no endpoint", inside)
		}
		st2 := state(w, "node2", own, prog(true))
		if !st2.Serves(ipX) {
			t.Errorf("inside=%v: node2 does not announce X", inside)
		}
		if e := st2.Eligible(ipX); !slices.Equal(e, []string{"node2"}) {
			t.Errorf("inside=%v: eligible for X %v, want [node2]", inside, e)
		}
	}
}

func TestLoadBalancerHolders(t *testing.T) {
	c := fakecluster.PoolsAndCIDRs()
	c.Pools = append(c.Pools, config.PoolConfig{Name: "team-a-only", Addresses: []string{"203.0.113.0/28"}, Namespaces: []string{"team-a"}})
	w := fakecluster.NewWorld(t, c)
	shared := func(port int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			fakecluster.LB(ipX.String(), false)(s)
			s.Annotations = map[string]string{alloc.AnnotationAllowSharedIP: "k"}
			s.Spec.Ports[0].Port = port
		}
	}
	w.Service("team-a", "a", shared(80))
	w.Service("team-a", "b", shared(443))
	w.Service("team-a", "unshared", fakecluster.LB(ipX.String(), false))   // a status edit by hand: younger, refused
	w.Service("team-b", "squatter", fakecluster.LB("203.0.113.5", false))  // a pool team-b may not use
	w.Service("team-b", "outside", fakecluster.LB("198.51.100.40", false)) // in no pool: kept (a pool shrank under it)
	w.Service("team-b", "on-node", fakecluster.LB("10.0.0.11", false))     // a node's address
	w.Endpoints("team-a", "a", "node1")
	w.Endpoints("team-a", "b", "node1", "node2")
	own := w.Resolve()
	if h := own.Held[ipX]; h == nil || !slices.Equal(h.Services, []portal.ServiceKey{fakecluster.Key("team-a", "a"), fakecluster.Key("team-a", "b")}) {
		t.Fatalf("X held by %+v", h)
	}
	if h := own.Held[netip.MustParseAddr("198.51.100.40")]; h == nil || h.Kind != claims.HeldByLoadBalancer || !slices.Equal(own.LB[fakecluster.Key("team-b", "outside")], []netip.Addr{netip.MustParseAddr("198.51.100.40")}) {
		t.Errorf("an address outside every pool: held by %+v, team-b/outside holds %v", h, own.LB[fakecluster.Key("team-b", "outside")])
	}
	for _, k := range []portal.ServiceKey{fakecluster.Key("team-a", "unshared"), fakecluster.Key("team-b", "squatter"), fakecluster.Key("team-b", "on-node")} {
		if len(own.LB[k]) != 0 {
			t.Errorf("%s holds %v", k, own.LB[k])
		}
	}
	var ips []string
	for _, tg := range targets(TargetInput{Services: w.Svcs, Slices: w.Eps, Nodes: w.Nodes, Own: own}) {
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
	c := fakecluster.PoolsAndCIDRs()
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/24", "203.0.113.0/24") // so that only a holder refuses them
	w := fakecluster.NewWorld(t, c)
	now := metav1.Now()
	terminating := func(mod func(*corev1.Service)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			mod(s)
			s.DeletionTimestamp, s.Finalizers = &now, []string{"example.com/hold"}
		}
	}
	foreign := "example.com/lb"
	w.Service("team-a", "web", terminating(fakecluster.LB(ipX.String(), false)))
	w.Service("team-a", "other", terminating(func(s *corev1.Service) {
		fakecluster.LB("203.0.113.9", false)(s)
		s.Spec.LoadBalancerClass = &foreign
	}))
	w.Service("team-a", "ext", terminating(fakecluster.ExternalIPs(ipE.String())))
	w.Service("team-b", "taker", func(s *corev1.Service) {
		fakecluster.LB("", false)(s)
		s.Spec.ExternalIPs = []string{ipX.String(), "203.0.113.9", ipE.String()}
	})
	w.Endpoints("team-a", "web", "node1")
	w.Endpoints("team-a", "ext", "node1")
	own := w.Resolve()
	if !slices.Equal(own.LB[fakecluster.Key("team-a", "web")], []netip.Addr{ipX}) || !slices.Equal(own.External[fakecluster.Key("team-a", "ext")], []netip.Addr{ipE}) {
		t.Errorf("terminating Services hold %v and %v", own.LB[fakecluster.Key("team-a", "web")], own.External[fakecluster.Key("team-a", "ext")])
	}
	if h := own.Held[netip.MustParseAddr("203.0.113.9")]; h == nil || h.Kind != claims.HeldByForeignLB {
		t.Errorf("another controller's address of a terminating Service is held by %+v", h)
	}
	if got := fakecluster.RefusalsOf(own)["team-b/taker"]; !slices.Equal(got, []string{claims.ReasonExternalIPConflict, claims.ReasonExternalIPConflict, claims.ReasonExternalIPConflict}) {
		t.Errorf("team-b/taker's refusals %v, want all three of its external IPs refused as held", got)
	}
	var ips []string
	for _, tg := range targets(TargetInput{Services: w.Svcs, Slices: w.Eps, Nodes: w.Nodes, Own: own}) {
		ips = append(ips, tg.IP.String()+"/"+tg.Service.Name)
	}
	if !slices.Equal(ips, []string{"192.0.2.1/web", "198.51.100.7/ext"}) {
		t.Errorf("targets %v, want the terminating Services' addresses", ips)
	}
}
