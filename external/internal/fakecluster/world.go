package fakecluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/internal/hooktest"
	"github.com/onehop/onehop/portal"
)

// World is a small cluster for the registry: two nodes, pools and CIDRs.
type World struct {
	T     *testing.T
	Cfg   *config.Parsed
	Reg   *claims.Registry
	Nodes []*corev1.Node
	Svcs  []*corev1.Service
	Pods  []*corev1.Pod
	Eps   []*discoveryv1.EndpointSlice
	Clock time.Time
}

// NewWorld is a World of the configuration c, with nodes node1 and node2.
func NewWorld(t *testing.T, c config.Config) *World {
	t.Helper()
	cfg, err := c.Parse()
	if err != nil {
		t.Fatal(err)
	}
	w := &World{T: t, Cfg: cfg, Reg: claims.New(cfg), Clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i, n := range []string{"node1", "node2"} {
		w.Nodes = append(w.Nodes, hooktest.Node(n, func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1" + string(rune('1'+i))}}
		}))
	}
	return w
}

// Created hands out creation times, each later than the last.
func (w *World) Created() metav1.Time {
	w.Clock = w.Clock.Add(time.Minute)
	return metav1.NewTime(w.Clock)
}

// Service adds Service ns/name, a ClusterIP Service of port 80 changed by
// mod.
func (w *World) Service(ns, name string, mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name), CreationTimestamp: w.Created()},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0." + string(rune('1'+len(w.Svcs))),
			Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if mod != nil {
		mod(s)
	}
	w.Svcs = append(w.Svcs, s)
	return s
}

// Pod adds Pod ns/name (see hooktest.Pod), changed by mod.
func (w *World) Pod(ns, name, ip, node, podIP string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := hooktest.Pod(name, ip, w.Created(), node, podIP)
	p.Namespace, p.UID = ns, types.UID("pod-"+ns+"/"+name)
	for _, m := range mod {
		m(p)
	}
	w.Pods = append(w.Pods, p)
	return p
}

// Endpoints gives Service ns/name one ready endpoint on each node named.
func (w *World) Endpoints(ns, name string, nodes ...string) {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}}
	ready := true
	for _, n := range nodes {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	w.Eps = append(w.Eps, es)
}

// Resolve is the registry's answer over the world.
func (w *World) Resolve() *claims.Ownership {
	return w.Reg.Resolve(claims.Input{Services: w.Svcs, Pods: w.Pods, Nodes: w.Nodes})
}

// RefusalsOf maps "namespace/name" to the reasons of its refusals.
func RefusalsOf(o *claims.Ownership) map[string][]string {
	out := map[string][]string{}
	for _, r := range o.Refusals {
		k := r.Obj.GetNamespace() + "/" + r.Obj.GetName()
		out[k] = append(out[k], r.Reason)
	}
	return out
}

// LB makes a Service a LoadBalancer, of the Local policy when local, with
// ip in its status unless it is "".
func LB(ip string, local bool) func(*corev1.Service) {
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

// ExternalIPs gives a Service ips as spec.externalIPs.
func ExternalIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

// Key is ns/name.
func Key(ns, name string) portal.ServiceKey { return portal.ServiceKey{Namespace: ns, Name: name} }

// PoolsAndCIDRs is a pool for Services (192.0.2.0/28), one for Pods
// (192.0.2.16/28) and externalIPCIDRs 198.51.100.0/24.
func PoolsAndCIDRs() config.Config {
	return config.Config{
		Pools:           []config.PoolConfig{{Name: "main", Addresses: []string{"192.0.2.0/28"}}, {Name: "pods", Addresses: []string{"192.0.2.16/28"}, AllowPods: true}},
		ExternalIPCIDRs: []string{"198.51.100.0/24"},
	}
}
