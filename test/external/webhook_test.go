package external

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/webhook"
)

func createReadyNode(t *testing.T, c kubernetes.Interface, name, addr string) {
	t.Helper()
	ctx := context.Background()
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

type hookReceiver struct {
	mu    sync.Mutex
	calls []webhook.Payload
	bad   int
}

func (r *hookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	var p webhook.Payload
	if !webhook.Verify([]byte("s3cret"), body, req.Header.Get(webhook.SignatureHeader)) || json.Unmarshal(body, &p) != nil {
		r.bad++
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.calls = append(r.calls, p)
}

// waitNodes waits for a call about svc whose node list is want.
func (r *hookReceiver) waitNodes(t *testing.T, svc string, want ...string) webhook.Payload {
	t.Helper()
	var last webhook.Payload
	_, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i := len(r.calls) - 1; i >= 0; i-- {
			if r.calls[i].Service == svc {
				last = r.calls[i]
				var names []string
				for _, n := range last.Nodes {
					names = append(names, n.Name)
				}
				return slices.Equal(names, want)
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("webhook: last call for %s %+v, want nodes %v", svc, last, want)
	}
	return last
}

// TestWebhookFollowsEndpoints: the leader POSTs signed state; under the
// Local policy the node list follows the endpoint from n1 to n2.
func TestWebhookFollowsEndpoints(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	_, c := tp.startControlPlane("cp", "")
	rcv := &hookReceiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	createReadyNode(t, c, "n1", "10.0.0.11")
	createReadyNode(t, c, "n2", "10.0.0.12")
	cfg := ipamConfig()
	cfg.Webhook = &webhook.Config{URL: srv.URL, Secret: "s3cret", MaxBackoffSeconds: 1}
	runHook(t, cfg, c, "n1")
	runHook(t, cfg, c, "n2")

	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ips := lbIPs(t, c, "web", "allocation", some)
	setEndpoints(t, c, "web", map[string]string{"n1": "10.244.1.2"})
	p := rcv.waitNodes(t, "default/web", "n1")
	if !slices.Equal(p.IPs, ips) || len(p.Ports) != 1 || p.Ports[0].Port != 80 || p.Ports[0].Protocol != "TCP" ||
		p.HealthCheckNodePort == 0 || !slices.Equal(p.Nodes[0].Addresses, []string{"10.0.0.11"}) {
		t.Fatalf("payload %+v; want ips %v, port 80/TCP, a health-check node port, n1's address", p, ips)
	}
	t0 := time.Now()
	setEndpoints(t, c, "web", map[string]string{"n2": "10.244.2.2"})
	rcv.waitNodes(t, "default/web", "n2")
	t.Logf("webhook told of the endpoint move %v after the EndpointSlice update", time.Since(t0).Round(time.Millisecond))
	if err := c.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		l := rcv.calls[len(rcv.calls)-1]
		return l.Service == "default/web" && l.Deleted
	})
	if !ok || rcv.bad != 0 {
		t.Fatalf("no deletion call (or %d bad requests)", rcv.bad)
	}
}
