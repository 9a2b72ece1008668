package external

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/portal"
)

func node(name string, mod ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mod {
		m(n)
	}
	return n
}

func lbService(name string, local bool, ips ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if local {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30123
	}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func slice(svc string, eps map[string]bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	for n, ready := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return es
}

func TestTargets(t *testing.T) {
	cfg, err := Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"192.0.2.0/28"}}}, ExternalIPCIDRs: []string{"198.51.100.0/24"}}.parse()
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	other := "example.com/other"
	nodes := []*corev1.Node{
		node("a"), node("b"),
		node("cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }),
		node("notready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }),
		node("deleting", func(n *corev1.Node) { n.DeletionTimestamp = &now }),
		node("scaledown", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: taintToBeDeleted}} }),
		node("excluded", func(n *corev1.Node) { n.Labels = map[string]string{labelExcludeFromLB: ""} }),
	}
	ext := lbService("ext", false)
	ext.Spec.Type = corev1.ServiceTypeClusterIP
	ext.Spec.ExternalIPs = []string{"198.51.100.7", "203.0.113.1"} // second one not allowed
	foreign := lbService("foreign", false, "192.0.2.9")
	foreign.Spec.LoadBalancerClass = &other
	svcs := []*corev1.Service{
		lbService("cluster", false, "192.0.2.1"),
		lbService("local", true, "192.0.2.2"),
		lbService("noeps", false, "192.0.2.3"),
		ext, foreign,
	}
	pods := []*corev1.Pod{pod("p", "198.51.100.50", metav1.Now(), "b", "10.244.1.5")}
	in := targetInput{
		nodes:    nodes,
		services: svcs,
		own:      newRegistry(cfg).resolve(registryInput{services: svcs, nodes: nodes, pods: pods}),
		slices: []*discoveryv1.EndpointSlice{
			slice("cluster", map[string]bool{"a": true}),
			slice("local", map[string]bool{"b": true, "cordoned": true, "notready": true, "a": false}),
			slice("noeps", map[string]bool{"a": false}),
			slice("ext", map[string]bool{"b": true}),
			slice("foreign", map[string]bool{"b": true}),
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
	st := func(local bool, nodes []string, prog map[served]programmed) *State {
		return &State{Node: "a", Targets: []Target{{IP: ip, Service: a, Local: local, Nodes: nodes}}, programmed: prog}
	}
	both := func(prog map[served]programmed) *State {
		return &State{Node: "a", Targets: []Target{{IP: ip, Service: a, Nodes: []string{"a", "b"}}, {IP: ip, Service: b, Nodes: []string{"a"}}}, programmed: prog}
	}
	for _, tc := range []struct {
		name  string
		s     *State
		serve bool
	}{
		{"eligible and programmed", st(false, []string{"a", "b"}, map[served]programmed{{ip, a}: {anyEndpoint: true}}), true},
		{"not programmed yet", st(false, []string{"a"}, nil), false},
		{"programmed without endpoints", st(false, []string{"a"}, map[served]programmed{{ip, a}: {}}), false},
		{"programmed for another Service only", st(false, []string{"a"}, map[served]programmed{{ip, b}: {anyEndpoint: true, localEndpoint: true}}), false},
		{"not eligible", st(false, []string{"b"}, map[served]programmed{{ip, a}: {anyEndpoint: true}}), false},
		{"local without local endpoint in kernel", st(true, []string{"a"}, map[served]programmed{{ip, a}: {anyEndpoint: true}}), false},
		{"local with local endpoint", st(true, []string{"a"}, map[served]programmed{{ip, a}: {anyEndpoint: true, localEndpoint: true}}), true},
		{"shared: both holders programmed", both(map[served]programmed{{ip, a}: {anyEndpoint: true}, {ip, b}: {anyEndpoint: true}}), true},
		{"shared: one holder not programmed here", both(map[served]programmed{{ip, a}: {anyEndpoint: true}}), false},
		{"pod IP not mapped here yet", &State{Node: "a", Targets: []Target{{IP: ip, Pod: true, Nodes: []string{"a"}}}}, false},
		{"pod IP mapped", &State{Node: "a", Targets: []Target{{IP: ip, Pod: true, Nodes: []string{"a"}}}, podIPs: map[netip.Addr]bool{ip: true}}, true},
		{"no target", &State{Node: "a", programmed: map[served]programmed{{ip, a}: {anyEndpoint: true}}}, false},
	} {
		if got := tc.s.Serves(ip); got != tc.serve {
			t.Errorf("%s: Serves %v, want %v", tc.name, got, tc.serve)
		}
	}
	if got := both(nil).Eligible(ip); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Eligible of a shared IP: %v, want the nodes serving both Services [a]", got)
	}
}

func pod(name, ip string, created metav1.Time, node, podIP string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pod-" + name), CreationTimestamp: created,
		Annotations: map[string]string{AnnotationExternalIP: ip}}, Spec: corev1.PodSpec{NodeName: node}}
	if podIP != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: podIP}}
	}
	return p
}

func TestPodExternalIPs(t *testing.T) {
	cfg, err := Config{Pools: []PoolConfig{{Name: "pods", Addresses: []string{"192.0.2.0/28"}, AllowPods: true}, {Name: "lb", Addresses: []string{"192.0.2.16/28"}}}}.parse()
	if err != nil {
		t.Fatal(err)
	}
	t0 := metav1.Now()
	t1 := metav1.NewTime(t0.Add(1e9))
	done := pod("done", "192.0.2.5", t0, "a", "10.244.0.9")
	done.Status.Phase = corev1.PodSucceeded
	own := newRegistry(cfg).resolve(registryInput{pods: []*corev1.Pod{
		pod("young", "192.0.2.1", t1, "b", "10.244.1.2"),
		pod("old", "192.0.2.1", t0, "a", "10.244.0.2"),
		pod("lbpool", "192.0.2.17", t0, "a", "10.244.0.3"),
		pod("bad", "nope", t0, "a", "10.244.0.4"),
		pod("pending", "192.0.2.2", t0, "", ""),
		pod("v6only", "192.0.2.3", t0, "a", "fd00::3"),
		done,
	}})
	got, refused := own.pods, own.refusals
	want := []PodExternalIP{{IP: netip.MustParseAddr("192.0.2.1"), PodIP: netip.MustParseAddr("10.244.0.2"), Pod: portal.ServiceKey{Namespace: "ns", Name: "old"}, NodeName: "a"}}
	if !slices.Equal(got, want) {
		t.Errorf("mapped %v, want %v", got, want)
	}
	reasons := map[string]string{}
	for _, r := range refused {
		reasons[r.obj.GetName()] = r.reason
	}
	wantR := map[string]string{"young": "ExternalIPConflict", "lbpool": "ExternalIPNotAllowed", "bad": "BadAnnotation"}
	if len(reasons) != len(wantR) {
		t.Errorf("refusals %v, want %v", reasons, wantR)
	}
	for n, r := range wantR {
		if reasons[n] != r {
			t.Errorf("pod %s: refusal %q, want %q", n, reasons[n], r)
		}
	}
}

func TestRequestFor(t *testing.T) {
	s := lbService("x", false)
	s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.1, 2001:db8::1", AnnotationAllowSharedIP: "k", AnnotationAddressPool: "p"}
	s.Spec.LoadBalancerIP = "192.0.2.99" // the annotation wins
	req, err := requestFor(s)
	if err != nil || len(req.Requested) != 2 || req.SharingKey != "k" || req.Pool != "p" || req.Requested[0].String() != "192.0.2.1" {
		t.Errorf("got %+v, %v", req, err)
	}
	s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.300"}
	if _, err := requestFor(s); err == nil {
		t.Error("bad annotation accepted")
	}
	s.Annotations = nil
	if req, err := requestFor(s); err != nil || len(req.Requested) != 1 || req.Requested[0].String() != "192.0.2.99" {
		t.Errorf("spec.loadBalancerIP: got %+v, %v", req, err)
	}
}
