package portal

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestTrimForCache: managed fields and kubectl's last-applied copy go, the
// annotations the model reads stay; TrimManagedFields keeps the copy.
func TestTrimForCache(t *testing.T) {
	mk := func() *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
			Annotations:   map[string]string{lastApplied: `{"kind":"Service"}`, v1.AnnotationTopologyMode: "Auto"}}}
	}
	got, err := TrimForCache(mk())
	if err != nil {
		t.Fatal(err)
	}
	s := got.(*v1.Service)
	if s.ManagedFields != nil || s.Annotations[lastApplied] != "" || s.Annotations[v1.AnnotationTopologyMode] != "Auto" {
		t.Errorf("TrimForCache left %+v", s.ObjectMeta)
	}
	got, _ = TrimManagedFields(mk())
	if s := got.(*v1.Service); s.ManagedFields != nil || s.Annotations[lastApplied] == "" {
		t.Errorf("TrimManagedFields left %+v", s.ObjectMeta)
	}
	if got, err := TrimForCache("not an object"); err != nil || got != "not an object" {
		t.Errorf("an unknown object: %v, %v", got, err)
	}
}

// An EndpointSlice keeps what the model reads, and a Service all but its
// selector and conditions; the model built from the trimmed objects is
// the one built from the whole ones.
func TestTrimKeepsWhatTheModelReads(t *testing.T) {
	yes, no := true, false
	node, zone, host := "node-1", "zone-a", "web-0"
	mkSlice := func() *discovery.EndpointSlice {
		return &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "web-x", Namespace: "shop", ResourceVersion: "7",
				Labels:          map[string]string{LabelServiceName: "web", discovery.LabelManagedBy: "endpointslice-controller.k8s.io"},
				Annotations:     map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-12-03T08:00:00Z", "other": "x"},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web"}}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
			Endpoints: append(make([]discovery.Endpoint, 0, 8), discovery.Endpoint{
				Addresses:  []string{"10.244.1.10"},
				Conditions: discovery.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				NodeName:   &node, Zone: &zone, Hostname: &host,
				TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-0", UID: "u"},
				Hints:     &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zone}}},
			}),
		}
	}
	got, _ := TrimForCache(mkSlice())
	es := got.(*discovery.EndpointSlice)
	ep := es.Endpoints[0]
	if es.Labels[LabelServiceName] != "web" || len(es.Labels) != 1 || es.Annotations["other"] != "" ||
		es.Annotations[v1.EndpointsLastChangeTriggerTime] == "" || es.OwnerReferences != nil || cap(es.Endpoints) != 1 ||
		ep.TargetRef != nil || ep.Hostname != nil || ep.Zone != nil || *ep.NodeName != node || !*ep.Conditions.Ready ||
		*ep.Conditions.Terminating || ep.Hints == nil || es.Name != "web-x" || es.ResourceVersion != "7" || len(es.Ports) != 1 {
		t.Errorf("trimmed slice: %+v", es)
	}

	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "s"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"}, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Type: v1.ServiceTypeClusterIP, Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	cfg := Config{NodeName: node}
	whole, _ := cfg.Build(svc.DeepCopy(), []*discovery.EndpointSlice{mkSlice()})
	trimmedSvc, _ := TrimForCache(svc.DeepCopy())
	trimmed, _ := cfg.Build(trimmedSvc.(*v1.Service), []*discovery.EndpointSlice{es})
	if trimmedSvc.(*v1.Service).Spec.Selector != nil || !whole.Equal(trimmed) || len(whole.Portals) == 0 {
		t.Errorf("the model differs: whole %+v, trimmed %+v", whole, trimmed)
	}
}
