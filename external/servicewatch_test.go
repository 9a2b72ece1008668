package external

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/onehop/onehop/portal"
)

// TestHookSharesTheModelsWatch: with WithServiceWatch the agent watches
// Services and EndpointSlices once for its model and its hook, and the
// hook still sees what the model leaves out: a Service of another proxy
// holds its cluster IP, so another Service's spec.externalIPs entry for
// that address is refused.
func TestHookSharesTheModelsWatch(t *testing.T) {
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other",
		Labels: map[string]string{portal.LabelServiceProxyName: "someone-else"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.50", ClusterIPs: []string{"10.96.0.50"},
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			ExternalIPs: []string{"10.96.0.50"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	client := fake.NewClientset(other, web)
	w := portal.NewServiceWatch(client, 0)
	h, err := New(Config{LeaseNamespace: "default", ExternalIPCIDRs: []string{"10.96.0.0/16"}}, client, "node1",
		slog.New(slog.NewTextHandler(io.Discard, nil)), WithServiceWatch(w))
	if err != nil {
		t.Fatal(err)
	}
	ctx := runHook(t, h)
	tr := portal.NewTracker(portal.Config{NodeName: "node1"}, nil, nil)
	synced, err := (&portal.Informers{Client: client, NodeName: "node1", Watch: w}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := portal.WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	if tr.Service(keyOf(web)) == nil || tr.Service(keyOf(other)) != nil {
		t.Errorf("the model holds web: %v, other's Service: %v; want web alone", tr.Service(keyOf(web)) != nil, tr.Service(keyOf(other)) != nil)
	}
	var refused map[portal.ServiceKey][]netip.Addr
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ok bool
		if refused, ok = h.RefusedExternalIPs(); ok || time.Now().After(deadline) {
			break
		}
	}
	if got := refused[keyOf(web)]; len(got) != 1 || got[0] != netip.MustParseAddr("10.96.0.50") {
		t.Errorf("refused %v; want web's 10.96.0.50, the cluster IP of another proxy's Service", refused)
	}
	watches := map[string]int{}
	for _, a := range client.Actions() {
		if a.GetVerb() == "watch" {
			watches[a.GetResource().Resource]++
		}
	}
	if watches["services"] != 1 || watches["endpointslices"] != 1 {
		t.Errorf("watches %v; want one of services and one of endpointslices for model and hook", watches)
	}
}
