package external

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/external/l2"
)

// BenchmarkNodeState10k is what a node agent's hook computes each time it
// looks (state): 10k Services with 10 endpoints each, 100 of them
// LoadBalancers. Before the hook became event-driven it looked 4 times a
// second whatever happened; now it looks on a change, or when a node's
// Lease could expire.
func BenchmarkNodeState10k(b *testing.B) {
	h, err := New(Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"203.0.113.0/24"}}}, SeparateController: true,
		L2: &l2.Config{Interfaces: []string{"eth0"}}}, fake.NewClientset(), "node1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		name := fmt.Sprintf("s-%05d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u" + name)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if i%100 == 0 {
			svc.Spec.Type = corev1.ServiceTypeLoadBalancer
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("203.0.113.%d", i/100+1)}}
		}
		_ = h.services.GetStore().Add(svc)
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		for j := range 10 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i/256%256, i%256, j+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(fmt.Sprintf("node%d", j%3+1))})
		}
		_ = h.slices.GetStore().Add(es)
	}
	for n := range 3 {
		_ = h.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node%d", n+1)}})
	}
	b.ResetTimer()
	for b.Loop() {
		fingerprint(h.state())
	}
}
