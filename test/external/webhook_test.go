package external

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/leases"
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

// hookCall is one verified request the receiver got.
type hookCall struct {
	gen      uint64
	snapshot bool
	service  string // "" for a snapshot
	services []string
	failed   bool // answered 503
}

// hookReceiver is a webhook receiver as external/README.md describes one:
// it verifies each request (webhook.VerifyRequest) and keeps the state in
// a webhook.Mirror. While failing is set it answers 503 to everything.
type hookReceiver struct {
	mu      sync.Mutex
	calls   []hookCall
	bad     int
	failing bool
	mirror  *webhook.Mirror
}

func newHookReceiver() *hookReceiver { return &hookReceiver{mirror: webhook.NewMirror()} }

// startTLSReceiver serves a hookReceiver over https (a self-signed
// certificate, whose CA file it returns) until the test ends.
func startTLSReceiver(t *testing.T) (rcv *hookReceiver, url, caFile string) {
	t.Helper()
	rcv = newHookReceiver()
	cert, caFile := selfSignedTLS(t)
	srv := httptest.NewUnstartedServer(rcv)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return rcv, srv.URL, caFile
}

func (r *hookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	var s webhook.Snapshot // a Payload's generation lands here too
	var p webhook.Payload
	if err := webhook.VerifyRequest([]byte("s3cret"), req.Header, body, time.Now(), webhook.DefaultMaxAge); err != nil ||
		json.Unmarshal(body, &s) != nil || json.Unmarshal(body, &p) != nil {
		r.bad++
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c := hookCall{gen: s.Generation, snapshot: s.Snapshot, service: p.Service, failed: r.failing}
	for _, p := range s.Services {
		c.services = append(c.services, p.Service)
	}
	r.calls = append(r.calls, c)
	if r.failing {
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	if _, err := r.mirror.Apply(body); err != nil {
		r.bad++
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
}

func (r *hookReceiver) setFailing(f bool) {
	r.mu.Lock()
	r.failing = f
	r.mu.Unlock()
}

// wait waits until cond holds for the calls received.
func (r *hookReceiver) wait(t *testing.T, what string, cond func([]hookCall) bool) []hookCall {
	t.Helper()
	var calls []hookCall
	_, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		r.mu.Lock()
		calls = slices.Clone(r.calls)
		r.mu.Unlock()
		return cond(calls)
	})
	if !ok {
		t.Fatalf("webhook: %s; calls %+v", what, calls)
	}
	return calls
}

// waitNodes waits until the receiver holds svc with node list want (no
// want: until it holds nothing for svc).
func (r *hookReceiver) waitNodes(t *testing.T, svc string, want ...string) webhook.Payload {
	t.Helper()
	var last webhook.Payload
	var held bool
	_, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		last, held = r.mirror.Service(svc)
		if len(want) == 0 {
			return !held
		}
		var names []string
		for _, n := range last.Nodes {
			names = append(names, n.Name)
		}
		return held && slices.Equal(names, want)
	})
	if !ok {
		t.Fatalf("webhook: receiver holds %s: %v %+v, want nodes %v", svc, held, last, want)
	}
	return last
}

// selfSignedTLS makes a certificate for 127.0.0.1 that is its own CA and
// returns it with the path of its PEM, for the sender to trust.
func selfSignedTLS(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "onehop webhook test receiver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "receiver-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path
}

// lease returns the allocator Lease's holder and webhook term.
func lease(t *testing.T, c kubernetes.Interface) (string, uint64) {
	t.Helper()
	return leaseIn(t, c, "default")
}

// leaseIn is lease of the Lease in namespace ns.
func leaseIn(t *testing.T, c kubernetes.Interface, ns string) (string, uint64) {
	t.Helper()
	l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	term, _ := strconv.ParseUint(l.Annotations[leases.AnnotationWebhookTerm], 10, 64)
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	return holder, term
}

// TestWebhookFollowsEndpoints: the leader POSTs signed state over https;
// under the Local policy the node list follows the endpoint from n1 to n2.
// Then leadership moves twice: once taken away (the demoted leader drops
// its retries; the next leader's generations are higher and it starts
// with a snapshot), once with every agent stopped while a Service is
// deleted (the restarted leader's snapshot deletes it at the receiver).
func TestWebhookFollowsEndpoints(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	_, c := tp.startControlPlane("cp", "")
	rcv, url, caFile := startTLSReceiver(t)
	createReadyNode(t, c, "n1", "10.0.0.11")
	createReadyNode(t, c, "n2", "10.0.0.12")
	cfg := ipamConfig()
	cfg.Webhook = &webhook.Config{URL: url, CAFile: caFile, Secret: "s3cret", MaxBackoffSeconds: 1}
	stops := map[string]func(){"n1": runHook(t, cfg, c, "n1"), "n2": runHook(t, cfg, c, "n2")}

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
	calls := rcv.wait(t, "a first call", func(cs []hookCall) bool { return len(cs) > 0 })
	leader, term1 := lease(t, c)
	if !calls[0].snapshot || webhook.TermOf(calls[0].gen) != term1 || term1 == 0 {
		t.Fatalf("first call %+v: want a snapshot of term %d (the Lease's)", calls[0], term1)
	}
	t0 := time.Now()
	setEndpoints(t, c, "web", map[string]string{"n2": "10.244.2.2"})
	rcv.waitNodes(t, "default/web", "n2")
	t.Logf("webhook told of the endpoint move %v after the EndpointSlice update", time.Since(t0).Round(time.Millisecond))

	// The receiver fails; the leader retries the move back to n1. Then
	// someone else takes the Lease: the leader is demoted and must drop
	// its retries, and the next leader (either agent) starts a new term.
	rcv.setFailing(true)
	from := len(rcv.wait(t, "", func([]hookCall) bool { return true }))
	setEndpoints(t, c, "web", map[string]string{"n1": "10.244.1.3"})
	rcv.wait(t, "the leader retries", func(cs []hookCall) bool {
		n := 0
		for _, x := range cs[from:] {
			if x.service == "default/web" && webhook.TermOf(x.gen) == term1 {
				n++
			}
		}
		return n >= 2
	})
	stealLease(t, c, 4)
	stolen := time.Now()
	t.Logf("Lease of %s (term %d) taken for 4s", leader, term1)
	// The next term's calls fail too at first: the old leader would be
	// retrying (every second at most) while the new one backs off 200+400+800 ms.
	calls = rcv.wait(t, "three calls of the next term", func(cs []hookCall) bool {
		n := 0
		for _, x := range cs {
			if webhook.TermOf(x.gen) > term1 {
				n++
			}
		}
		return n >= 3
	})
	t.Logf("the next term's third request came %v after the Lease was taken for 4s", time.Since(stolen).Round(time.Millisecond))
	rcv.setFailing(false)
	rcv.waitNodes(t, "default/web", "n1")
	leader2, term2 := lease(t, c)
	first := slices.IndexFunc(calls, func(x hookCall) bool { return webhook.TermOf(x.gen) > term1 })
	if term2 != term1+1 || webhook.TermOf(calls[first].gen) != term2 || !calls[first].snapshot ||
		!slices.Equal(calls[first].services, []string{"default/web"}) {
		t.Fatalf("after the Lease was taken: leader %s, term %d (was %d); first call of the term %+v, want a snapshot of default/web in term %d",
			leader2, term2, term1, calls[first], term1+1)
	}
	for _, x := range rcv.wait(t, "", func([]hookCall) bool { return true })[first:] {
		if webhook.TermOf(x.gen) <= term1 {
			t.Fatalf("the demoted leader still sent %+v after the next term began", x)
		}
	}
	t.Logf("leader %s (term %d) -> %s (term %d)", leader, term1, leader2, term2)

	// A Service deleted while no agent runs is never sent as deleted: the
	// next leader's snapshot must make the receiver drop it. The agent
	// restarted has the last leader's name, and still a higher term.
	createLB(t, c, "gone", 81)
	lbIPs(t, c, "gone", "allocation", some)
	setEndpoints(t, c, "gone", map[string]string{"n1": "10.244.1.9"})
	rcv.waitNodes(t, "default/gone", "n1", "n2")
	for n, stop := range stops {
		if n != leader2 {
			stop()
		}
	}
	stops[leader2]()
	if err := c.CoreV1().Services("default").Delete(context.Background(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setEndpoints(t, c, "web", map[string]string{"n2": "10.244.2.3"})
	from = len(rcv.wait(t, "", func([]hookCall) bool { return true }))
	restarted := time.Now()
	runHook(t, cfg, c, leader2)
	rcv.waitNodes(t, "default/gone")
	t.Logf("the restarted leader's snapshot deleted default/gone at the receiver %v after the agent started", time.Since(restarted).Round(time.Millisecond))
	rcv.waitNodes(t, "default/web", "n2")
	calls = rcv.wait(t, "", func([]hookCall) bool { return true })[from:]
	_, term3 := lease(t, c)
	if term3 != term2+1 || !calls[0].snapshot || webhook.TermOf(calls[0].gen) != term3 || !slices.Equal(calls[0].services, []string{"default/web"}) {
		t.Fatalf("restarted %s: term %d (was %d), first call %+v; want a snapshot of default/web alone in term %d", leader2, term3, term2, calls[0], term2+1)
	}

	if err := c.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rcv.waitNodes(t, "default/web")
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if rcv.bad != 0 {
		t.Fatalf("%d requests failed verification", rcv.bad)
	}
}

// stealLease makes the allocator Lease held by someone who is no agent
// for secs seconds, as a partitioned leader would see it.
func stealLease(t *testing.T, c kubernetes.Interface, secs int32) {
	t.Helper()
	ctx := context.Background()
	for range 20 {
		l, err := c.CoordinationV1().Leases("default").Get(ctx, leases.AllocatorLeaseName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.NewMicroTime(time.Now())
		transitions := int32(1)
		if l.Spec.LeaseTransitions != nil {
			transitions += *l.Spec.LeaseTransitions
		}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = new("intruder"), &secs
		l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseTransitions = &now, &now, &transitions
		if _, err = c.CoordinationV1().Leases("default").Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			return
		}
	}
	t.Fatal("could not take the allocator Lease")
}
