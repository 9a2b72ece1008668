package external

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/test/cluster"
)

// keyedCall is one request a keyedReceiver took: the key that verified
// its signature ("" for none) and the Services it names.
type keyedCall struct {
	key      string
	snapshot bool
	services []string
}

// keyedReceiver is a webhook receiver that knows several keys and records
// which one signed each request; it mirrors the requests any of them
// verifies.
type keyedReceiver struct {
	keys   map[string][]byte
	mirror *webhook.Mirror

	mu    sync.Mutex
	calls []keyedCall
}

// startKeyedReceiver serves a keyedReceiver over https until the test
// ends; it returns its URL and the PEM of its self-signed certificate.
func startKeyedReceiver(t *testing.T, keys ...string) (*keyedReceiver, string, string) {
	t.Helper()
	r := &keyedReceiver{keys: map[string][]byte{}, mirror: webhook.NewMirror()}
	for _, k := range keys {
		r.keys[k] = []byte(k)
	}
	cert, caFile := selfSignedTLS(t)
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(r)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return r, srv.URL, string(ca)
}

func (r *keyedReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	c := keyedCall{}
	for name, k := range r.keys {
		if webhook.VerifyRequest(k, req.Header, body, time.Now(), webhook.DefaultMaxAge) == nil {
			c.key = name
		}
	}
	var s webhook.Snapshot
	var p webhook.Payload
	_ = json.Unmarshal(body, &s)
	_ = json.Unmarshal(body, &p)
	c.snapshot = s.Snapshot
	for _, x := range s.Services {
		c.services = append(c.services, x.Service)
	}
	if p.Service != "" {
		c.services = append(c.services, p.Service)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	if c.key == "" {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if _, err := r.mirror.Apply(body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
}

func (r *keyedReceiver) received() []keyedCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// waitCall waits for a request after the first from, signed with key,
// naming svc, and returns the number of requests received by then.
func (r *keyedReceiver) waitCall(t *testing.T, from int, key, svc string) int {
	t.Helper()
	var calls []keyedCall
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		calls = r.received()
		return slices.ContainsFunc(calls[min(from, len(calls)):], func(c keyedCall) bool {
			return c.key == key && slices.Contains(c.services, svc)
		})
	})
	if !ok {
		t.Fatalf("webhook: no request naming %s signed with %q after the first %d; requests %+v", svc, key, from, calls)
	}
	return len(calls)
}

// waitIPs waits until the receiver holds svc with the addresses want.
func (r *keyedReceiver) waitIPs(t *testing.T, svc string, want []string) {
	t.Helper()
	var p webhook.Payload
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		var held bool
		p, held = r.mirror.Service(svc)
		return held && slices.Equal(p.IPs, want)
	})
	if !ok {
		t.Fatalf("webhook: receiver holds %s as %+v, want IPs %v", svc, p, want)
	}
}

func setConfigMap(t *testing.T, c kubernetes.Interface, name, key, value string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: splitLeaseNamespace, Name: name}, Data: map[string]string{key: value}}
	if _, err := c.CoreV1().ConfigMaps(splitLeaseNamespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCRDWebhookFromSecret: the controller of a split install, under
// deploy/base's RBAC, with a webhook in its configuration file. A
// LoadBalancerWebhook created later, with its key in a Secret and its CA in
// a ConfigMap of the lease namespace, takes the file's place (its
// condition says so, and the file's receiver hears no more): its receiver
// gets signed POSTs with the addresses of the pool it picks, and never a
// Service of a pool it does not pick. A new key in the Secret signs the
// next requests, with no restart of the controller (its Lease stays, the
// sender alone starts a new term). An invalid change is Invalid and the
// receiver goes on getting requests under the last good configuration. A
// change of the pools picked applies, and once the LoadBalancerWebhook is
// deleted the file's webhook is in force again.
func TestCRDWebhookFromSecret(t *testing.T) {
	cp, _ := cluster.StartTest(t, "crdhook", "192.0.2.6")
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	createReadyNode(t, c, "n1", "10.0.0.11")
	fileRcv, fileURL, fileCA := startKeyedReceiver(t, "file-key")
	rcv, url, ca := startKeyedReceiver(t, "one", "two")
	pools, hooks := v1alpha1.LoadBalancerIPPools, v1alpha1.LoadBalancerWebhooks
	cr.apply(pools, "public", `{addresses: ["203.0.113.0/29"]}`)
	cr.apply(pools, "internal", `{addresses: ["198.51.100.0/29"]}`)
	setSecret(t, c, "hook-key", "hmac", "one\n") // trimmed, as a key file is
	setConfigMap(t, c, "hook-ca", "ca.pem", ca)

	fileCAPath := t.TempDir() + "/ca.pem"
	if err := os.WriteFile(fileCAPath, []byte(fileCA), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := sp.config(config.Config{CRDs: true,
		Webhook: &webhook.Config{URL: fileURL, Secret: "file-key", CAFile: fileCAPath, MaxBackoffSeconds: 1}})
	sp.runController(cfg, "onehop-controller-0", "")
	createLB(t, c, "web", 80, annotate("onehop.io/address-pool", "public"))
	createLB(t, c, "db", 5432, annotate("onehop.io/address-pool", "internal"))
	web := lbIPs(t, c, "web", "allocation from public", some)
	lbIPs(t, c, "db", "allocation from internal", some)
	fileRcv.waitCall(t, 0, "file-key", "default/db") // the file's webhook, before any resource: everything
	_, term0 := leaseIn(t, c, splitLeaseNamespace)

	cr.apply(hooks, "lb", `{url: "`+url+`", secretRef: {name: hook-key, key: hmac}, caFrom: {configMapKeyRef: {name: hook-ca, key: ca.pem}},
		maxBackoffSeconds: 1, ipAddressPools: [public]}`)
	cr.accepted(hooks, "lb", "True", "in place of the configuration file's webhook section")
	n := rcv.waitCall(t, 0, "one", "default/web")
	rcv.waitIPs(t, "default/web", web)
	holder, term1 := leaseIn(t, c, splitLeaseNamespace)
	if term1 <= term0 {
		t.Errorf("the LoadBalancerWebhook's sender runs in term %d, not above the file's %d", term1, term0)
	}
	fromFile := len(fileRcv.received())

	// A new key: the next requests are signed with it, by a sender in a
	// term of its own, under the same Lease holder.
	setSecret(t, c, "hook-key", "hmac", "two")
	n = rcv.waitCall(t, n, "two", "default/web")
	createLB(t, c, "web2", 81, annotate("onehop.io/address-pool", "public"))
	n = rcv.waitCall(t, n, "two", "default/web2")
	rcv.waitIPs(t, "default/web2", lbIPs(t, c, "web2", "allocation from public", some))
	if h, term2 := leaseIn(t, c, splitLeaseNamespace); h != holder || term2 != term1+1 {
		t.Errorf("after the key changed: Lease held by %s in term %d, want %s in term %d (the sender alone restarted)", h, term2, holder, term1+1)
	}
	firstTwo := slices.IndexFunc(rcv.received(), func(c keyedCall) bool { return c.key == "two" })
	for _, x := range rcv.received()[firstTwo:] {
		if x.key != "two" {
			t.Errorf("a request signed %q after the first signed with the new key: %+v", x.key, x)
		}
	}

	// An invalid change (a key that is not in the Secret): Invalid, and the
	// last good configuration goes on sending, with its key.
	cr.apply(hooks, "lb", `{url: "`+url+`", secretRef: {name: hook-key, key: nope}, caFrom: {configMapKeyRef: {name: hook-ca, key: ca.pem}},
		maxBackoffSeconds: 1, ipAddressPools: [public]}`)
	cr.accepted(hooks, "lb", "False", `secretRef: Secret "hook-key" has no key "nope"; its last accepted version stays in force`)
	createLB(t, c, "web3", 82, annotate("onehop.io/address-pool", "public"))
	rcv.waitCall(t, n, "two", "default/web3")
	rcv.waitIPs(t, "default/web3", lbIPs(t, c, "web3", "allocation from public", some))

	for _, x := range rcv.received() {
		if slices.Contains(x.services, "default/db") {
			t.Errorf("the receiver was told of default/db, whose pool the webhook does not pick: %+v", x)
		}
		if x.key == "" {
			t.Errorf("a request no key verifies: %+v", x)
		}
	}
	if got := len(fileRcv.received()); got != fromFile {
		t.Errorf("the file's receiver got %d requests after the LoadBalancerWebhook took its place", got-fromFile)
	}

	// Picking the other pool instead: the receiver holds db, and no
	// longer web.
	cr.apply(hooks, "lb", `{url: "`+url+`", secretRef: {name: hook-key, key: hmac}, caFrom: {configMapKeyRef: {name: hook-ca, key: ca.pem}},
		maxBackoffSeconds: 1, ipAddressPools: [internal]}`)
	cr.accepted(hooks, "lb", "True", "in force")
	rcv.waitIPs(t, "default/db", lbIPs(t, c, "db", "allocation from internal", some))
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool { _, held := rcv.mirror.Service("default/web"); return !held }); !ok {
		t.Error("the receiver still holds default/web, whose pool the webhook no longer picks")
	}

	// Deleted, the LoadBalancerWebhook leaves the file's section in force
	// again.
	if err := cr.dyn.Resource(hooks).Delete(context.Background(), "lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fileRcv.waitCall(t, fromFile, "file-key", "default/web")
	checkNoDoubleAllocation(t, c)
}
