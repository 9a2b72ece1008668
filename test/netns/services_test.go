package netns

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The slices the harness writes look like the EndpointSlice controller's.
func TestEndpointSliceShape(t *testing.T) {
	n := &Node{Name: "node-1", Zone: "zone-a"}
	p := &Pod{Name: "echo-1-1", IP: "10.244.1.11", IP6: "fd00:244:1::11", Node: n}
	q := &Pod{Name: "echo-1-2", IP: "10.244.1.12", IP6: "fd00:244:1::12", Node: n}
	r := &Pod{Name: "echo-1-3", IP: "10.244.1.13", IP6: "fd00:244:1::13", Node: n}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "svc-uid"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
			{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53},
		}},
	}
	eps := []Endpoint{{Pod: p}, {Pod: q, NotReady: true}, {Pod: r, Terminating: true, Serving: true}}

	s := endpointSlice(svc, v1.IPv6Protocol, eps)
	if s.AddressType != discoveryv1.AddressTypeIPv6 || s.Endpoints[0].Addresses[0] != p.IP6 {
		t.Errorf("IPv6 slice: type %s, first address %v", s.AddressType, s.Endpoints[0].Addresses)
	}
	s = endpointSlice(svc, v1.IPv4Protocol, eps)
	if s.GenerateName != "web-" || s.Labels[discoveryv1.LabelServiceName] != "web" || s.Labels[discoveryv1.LabelManagedBy] != ManagedBy {
		t.Errorf("meta: %+v", s.ObjectMeta)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "svc-uid" || !*s.OwnerReferences[0].Controller {
		t.Errorf("owner: %+v", s.OwnerReferences)
	}
	if len(s.Ports) != 2 || *s.Ports[0].Port != 8080 || *s.Ports[1].Port != 53 || *s.Ports[1].Protocol != v1.ProtocolUDP || *s.Ports[0].Name != "http" {
		t.Errorf("ports: %+v", s.Ports)
	}
	type cond struct{ ready, serving, terminating bool }
	want := []cond{{true, true, false}, {false, false, false}, {false, true, true}}
	for i, e := range s.Endpoints {
		got := cond{*e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating}
		if got != want[i] {
			t.Errorf("endpoint %d conditions %+v, want %+v", i, got, want[i])
		}
		if *e.NodeName != "node-1" || *e.Zone != "zone-a" || e.TargetRef.Kind != "Pod" || e.Addresses[0] != eps[i].Pod.IP {
			t.Errorf("endpoint %d: %+v", i, e)
		}
	}
}
