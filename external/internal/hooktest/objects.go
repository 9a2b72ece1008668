package hooktest

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Node is a Ready node, changed by mod.
func Node(name string, mod ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mod {
		m(n)
	}
	return n
}

// LBService is a LoadBalancer Service of namespace ns with one TCP port,
// 80, of the Local policy when local, and ips in its status.
func LBService(name string, local bool, ips ...string) *corev1.Service {
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

// Slice is an EndpointSlice of Service ns/svc with an endpoint on each node
// of eps, ready or not.
func Slice(svc string, eps map[string]bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	for n, ready := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return es
}

// Pod is Pod ns/name, created at created, on node with podIP, that claims
// ip as its external IP (the annotation onehop.io/external-ip).
func Pod(name, ip string, created metav1.Time, node, podIP string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pod-" + name), CreationTimestamp: created,
		Annotations: map[string]string{"onehop.io/external-ip": ip}}, Spec: corev1.PodSpec{NodeName: node}}
	if podIP != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: podIP}}
	}
	return p
}
