package portal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestInformersSyncedMeansTrackerHasEverything: the agent's first sync
// replaces the whole ruleset, so "synced" must mean every listed object
// has reached the Tracker, not only the informers' stores (the handlers run
// behind them). A slow handler makes the difference visible.
func TestInformersSyncedMeansTrackerHasEverything(t *testing.T) {
	const n = 300
	var objs []runtime.Object
	for i := 0; i < n; i++ {
		objs = append(objs, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
				Ports:      []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80}}},
		})
	}
	client := fake.NewClientset(objs...)
	tr := NewTracker(Config{NodeName: "n1"}, nil, func() { time.Sleep(time.Millisecond) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	synced, err := (&Informers{Client: client, NodeName: "n1"}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i := 0; i < n; i++ {
		if tr.Service(ServiceKey{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}) == nil {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("informers reported synced with %d of %d Services not yet in the Tracker", missing, n)
	}
}

// TestInformersAskTheAPIServerForTheirPart: without a shared watch the
// API server selects (the handlers take all they are sent), so the
// selection must reach every list and watch request, made long after Start
// returned: a slice labelled headless and a Service of another proxy are
// never in the model. As kube-proxy, the headless label selects slices
// only: a Service with a cluster IP that carries it is served.
func TestInformersAskTheAPIServerForTheirPart(t *testing.T) {
	svc := func(name string, labels map[string]string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80}}}}
	}
	slice := func(svc string, labels map[string]string) *discovery.EndpointSlice {
		l := map[string]string{LabelServiceName: svc}
		for k, v := range labels {
			l[k] = v
		}
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: svc + "-x", Labels: l},
			AddressType: discovery.AddressTypeIPv4}
	}
	var requested []string
	client := fake.NewClientset(svc("web", nil), svc("their", map[string]string{LabelServiceProxyName: "someone-else"}),
		svc("labelled", map[string]string{LabelHeadless: ""}), slice("web", map[string]string{LabelHeadless: ""}))
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if r := a.GetResource().Resource; r == "services" || r == "endpointslices" {
			requested = append(requested, r+": "+a.(k8stesting.ListAction).GetListRestrictions().Labels.String())
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := NewTracker(Config{NodeName: "n1"}, nil, nil)
	synced, err := (&Informers{Client: client, NodeName: "n1"}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	svcSel, _ := serviceSelector("")
	want := map[string]string{"services": svcSel.String(), "endpointslices": sliceSelector().String()}
	for _, r := range requested {
		resource, sel, _ := strings.Cut(r, ": ")
		if sel != want[resource] {
			t.Errorf("list request %q; want the selection %q", r, want[resource])
		}
	}
	if len(requested) < 2 {
		t.Errorf("list requests %v; want Services and EndpointSlices", requested)
	}
	tr.mu.Lock()
	n := len(tr.slices)
	tr.mu.Unlock()
	if tr.Service(ServiceKey{Namespace: "shop", Name: "their"}) != nil || n != 0 {
		t.Errorf("the model holds another proxy's Service or a headless slice (%d slices)", n)
	}
	if tr.Service(ServiceKey{Namespace: "shop", Name: "labelled"}) == nil {
		t.Errorf("a Service labelled headless with a cluster IP is not in the model")
	}
}
