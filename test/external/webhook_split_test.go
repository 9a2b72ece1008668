package external

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/webhook"
)

// TestWebhookSplitController: the webhook sender as deploy/ ships it, in
// the controller under its own RBAC: it claims its term on the leader
// Lease, and its signed payloads follow a Local-policy Service's endpoint
// from n1 to n2. A refused request fails the test.
func TestWebhookSplitController(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	cp, c := tp.startControlPlane("cp", "")
	rcv, url, caFile := startTLSReceiver(t)
	createReadyNode(t, c, "n1", "10.0.0.11")
	createReadyNode(t, c, "n2", "10.0.0.12")
	sp := newSplit(t, cp)
	cfg := sp.config(ipamConfig())
	cfg.Webhook = &webhook.Config{URL: url, CAFile: caFile, Secret: "s3cret", MaxBackoffSeconds: 1}
	sp.runController(cfg, "onehop-controller-0", "")

	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ips := lbIPs(t, c, "web", "allocation", some)
	setEndpoints(t, c, "web", map[string]string{"n1": "10.244.1.2"})
	if p := rcv.waitNodes(t, "default/web", "n1"); !slices.Equal(p.IPs, ips) {
		t.Fatalf("payload %+v; want ips %v", p, ips)
	}
	setEndpoints(t, c, "web", map[string]string{"n2": "10.244.2.2"})
	rcv.waitNodes(t, "default/web", "n2")
	l, err := c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Annotations[leases.AnnotationWebhookTerm] == "" {
		t.Fatalf("leader Lease %v, %v: want a webhook term recorded on it", l, err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if rcv.bad > 0 {
		t.Errorf("the receiver rejected %d requests", rcv.bad)
	}
}
