package portal

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestInformersSelectFromAServiceWatch: over a watch of every Service and
// EndpointSlice, the model holds what the API server's label selection
// would have given it: no headless slice, no Service of another proxy, and a
// Service whose label moves it out of (or into) the selection leaves (or
// joins) the model. The watch's cache keeps every object and the
// Services' selectors.
func TestInformersSelectFromAServiceWatch(t *testing.T) {
	svc := func(name string, labels map[string]string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
				Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80}}}}
	}
	slice := func(svc string, labels map[string]string) *discovery.EndpointSlice {
		l := map[string]string{LabelServiceName: svc, discovery.LabelManagedBy: "endpointslice-controller.k8s.io"}
		for k, v := range labels {
			l[k] = v
		}
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: svc + "-x", Labels: l},
			AddressType: discovery.AddressTypeIPv4}
	}
	headless := map[string]string{LabelHeadless: ""}
	theirs := map[string]string{LabelServiceProxyName: "someone-else"}
	client := fake.NewClientset(svc("web", nil), svc("db", headless), svc("their", theirs),
		slice("web", nil), slice("db", headless), slice("their", theirs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := NewServiceWatch(client, 0)
	tr := NewTracker(Config{NodeName: "n1"}, nil, nil)
	synced, err := (&Informers{Client: client, NodeName: "n1", Watch: w}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	key := func(name string) ServiceKey { return ServiceKey{Namespace: "shop", Name: name} }
	model := func() (svcs, slices map[string]bool) {
		svcs, slices = map[string]bool{}, map[string]bool{}
		for _, n := range []string{"web", "db", "their"} {
			svcs[n] = tr.Service(key(n)) != nil
			tr.mu.Lock()
			slices[n] = len(tr.slices[key(n)]) > 0
			tr.mu.Unlock()
		}
		return svcs, slices
	}
	// As kube-proxy: Services by their proxy label, slices by the headless
	// one (the EndpointSlice controller copies a Service's proxy label to
	// its slices, and sets headless on those of Services without a cluster
	// IP alone).
	if s, es := model(); !s["web"] || !s["db"] || s["their"] || !es["web"] || es["db"] || !es["their"] {
		t.Errorf("the model holds Services %v, slices %v; want Services web and db, slices web and their", s, es)
	}
	if n := len(w.Services().GetStore().List()); n != 3 {
		t.Errorf("the watch caches %d Services, want all 3", n)
	}
	if o, ok, _ := w.Services().GetStore().GetByKey("shop/web"); !ok || o.(*v1.Service).Spec.Selector["app"] != "web" {
		t.Errorf("the watch's Service lost its selector: %+v", o)
	}
	if o, ok, _ := w.Slices().GetStore().GetByKey("shop/db-x"); !ok || len(o.(*discovery.EndpointSlice).Labels) != 2 {
		t.Errorf("the watch's slice keeps labels %+v, want the Service's name and headless", o)
	}

	// web moves to another proxy, their to this one.
	relabel := func(name string, labels map[string]string) {
		s, err := client.CoreV1().Services("shop").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels = labels
		if _, err := client.CoreV1().Services("shop").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("web", theirs)
	relabel("their", nil)
	deadline := time.Now().Add(10 * time.Second)
	for s, _ := model(); s["web"] || !s["their"]; s, _ = model() {
		if time.Now().After(deadline) {
			t.Fatalf("after relabelling the model holds %v; want their and not web", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TrimForSharedCache trims as TrimForCache but keeps the Service's
// selector (the cloud hook compares them), and both keep the labels the
// model selects slices by.
func TestTrimForSharedCacheKeepsTheSelector(t *testing.T) {
	mk := func() *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", OwnerReferences: []metav1.OwnerReference{{Name: "x"}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
			Spec:   v1.ServiceSpec{Selector: map[string]string{"app": "web"}},
			Status: v1.ServiceStatus{Conditions: []metav1.Condition{{Type: "Ready"}}}}
	}
	got, _ := TrimForSharedCache(mk())
	if s := got.(*v1.Service); s.Spec.Selector["app"] != "web" || s.ManagedFields != nil || s.OwnerReferences != nil || s.Status.Conditions != nil {
		t.Errorf("TrimForSharedCache left %+v", s)
	}
	if got, _ := TrimForCache(mk()); got.(*v1.Service).Spec.Selector != nil {
		t.Errorf("TrimForCache kept the selector")
	}
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelServiceName: "web",
		LabelServiceProxyName: "p", LabelHeadless: "", discovery.LabelManagedBy: "x", "app": "web"}}}
	got, _ = TrimForCache(es)
	if l := got.(*discovery.EndpointSlice).Labels; len(l) != 3 || l[LabelServiceProxyName] != "p" {
		t.Errorf("slice labels %v; want the Service's name, proxy name and headless", l)
	}
}
