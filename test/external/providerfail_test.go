package external

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
)

// TestProviderFailsLoudly: an agent's hook (all-in-one, against a real
// kube-apiserver) whose webhook secret file is missing keeps running and
// says so: a ProviderFailed event on its Node (one, however often the
// start is retried), onehop_provider_up 0 and a failure count on its
// /metrics, the error in its /healthz detail, which stays 200 (the
// dataplane serves). Once the secret file is written the provider starts
// on its next try: a ProviderRecovered event, the gauge at 1, the detail
// gone, and the webhook delivers signed payloads; the hook's metrics show
// the pools' addresses in use and in all, the webhook's requests by
// outcome and the IPs it sent.
func TestProviderFailsLoudly(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	_, c := tp.startControlPlane("cp", "")
	rcv, url, caFile := startTLSReceiver(t)
	createReadyNode(t, c, "node1", "10.0.0.11")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	metrics := dataplane.NewMetrics(reg)
	health := dataplane.NewHealthServer("127.0.0.1:0", time.Second, nil)
	health.SetMetrics(metrics)
	health.SyncNode(false, false)
	health.Updated() // the dataplane serves: /healthz is 200 but for the providers
	healthURL := serveLoopback(ctx, t, health.Serve) + "/healthz"
	metricsURL := serveLoopback(ctx, t, func(ctx context.Context, ln net.Listener) error {
		return metrics.ServeListener(ctx, ln, reg, false)
	}) + "/metrics"

	secret := filepath.Join(t.TempDir(), "webhook-secret")
	cfg := ipamConfig()
	cfg.Webhook = &webhook.Config{URL: url, CAFile: caFile, SecretFile: secret, MaxBackoffSeconds: 1}
	h, watch, err := newAgentHook(cfg, c, "node1", slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
		external.WithProviderHealth(health, metrics))
	if err != nil {
		t.Fatal(err)
	}
	if err := startModel(ctx, c, "node1", watch); err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "hook node1", h)

	msg := eventIn(t, c, "default", "node1", "ProviderFailed")
	if !strings.Contains(msg, "webhook") || !strings.Contains(msg, secret) {
		t.Fatalf("ProviderFailed on node1: %q; want the provider and the missing file named", msg)
	}
	code, detail := providerFailures(t, healthURL)
	if code != http.StatusOK || !strings.HasPrefix(detail["webhook"], "start: ") || !strings.Contains(detail["webhook"], secret) {
		t.Fatalf("/healthz %d, providerFailures %v; want 200 and webhook's start error", code, detail)
	}
	if v := scrape(t, metricsURL, `onehop_provider_up{provider="webhook"}`); v != "0" {
		t.Fatalf(`onehop_provider_up{provider="webhook"} = %q while failing, want 0`, v)
	}
	// Retried with back-off (1 s, 2 s, ...), with one event for them all.
	if _, ok := waitFor(ctx, 10*time.Second, func() bool {
		v := scrape(t, metricsURL, `onehop_provider_failures_total{provider="webhook",stage="start"}`)
		return v != "" && v != "0" && v != "1"
	}); !ok {
		t.Fatal("the webhook's start was not tried again")
	}
	if n := nodeEvents(t, c, "node1", "ProviderFailed"); n != 1 {
		t.Fatalf("%d ProviderFailed events on node1 after retries of one failure, want 1", n)
	}

	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventIn(t, c, "default", "node1", "ProviderRecovered")
	if code, detail := providerFailures(t, healthURL); code != http.StatusOK || len(detail) != 0 {
		t.Fatalf("/healthz after recovery %d, providerFailures %v; want 200 and none", code, detail)
	}
	if v := scrape(t, metricsURL, `onehop_provider_up{provider="webhook"}`); v != "1" {
		t.Fatalf(`onehop_provider_up{provider="webhook"} = %q after recovery, want 1`, v)
	}
	// The recovered provider works: a LoadBalancer's state reaches the receiver, signed with the secret.
	createLB(t, c, "web", 80)
	lbIPs(t, c, "web", "allocation", some)
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2"})
	rcv.waitNodes(t, "default/web", "node1")
	rcv.mu.Lock()
	bad := rcv.bad
	rcv.mu.Unlock()
	if bad > 0 {
		t.Errorf("the receiver rejected %d requests", bad)
	}

	// The hook's metrics of the leader: the pools' addresses (one of
	// main's three in use, none of manual's two), the webhook's requests
	// and the IPs it sent.
	for series, want := range map[string]string{
		`onehop_allocator_addresses_in_use_total{pool="main"}`:   "1",
		`onehop_allocator_addresses_total{pool="main"}`:          "3",
		`onehop_allocator_addresses_in_use_total{pool="manual"}`: "0",
		`onehop_allocator_addresses_total{pool="manual"}`:        "2",
		`onehop_announced_ips{provider="webhook"}`:               "1",
		`onehop_webhook_requests_total{outcome="rejected"}`:      "0",
	} {
		if _, ok := waitFor(ctx, 10*time.Second, func() bool { return scrape(t, metricsURL, series) == want }); !ok {
			t.Errorf("%s = %q, want %s", series, scrape(t, metricsURL, series), want)
		}
	}
	if v := scrape(t, metricsURL, `onehop_webhook_requests_total{outcome="success"}`); v == "" || v == "0" {
		t.Errorf(`onehop_webhook_requests_total{outcome="success"} = %q after a delivery, want at least 1`, v)
	}
	// A receiver that answers 503 counts as rejected; it is retried until
	// it takes the state.
	success := scrape(t, metricsURL, `onehop_webhook_requests_total{outcome="success"}`)
	rcv.setFailing(true)
	setEndpoints(t, c, "web", map[string]string{})
	if _, ok := waitFor(ctx, 10*time.Second, func() bool {
		v := scrape(t, metricsURL, `onehop_webhook_requests_total{outcome="rejected"}`)
		return v != "" && v != "0"
	}); !ok {
		t.Errorf("no rejected request counted while the receiver answers 503")
	}
	rcv.setFailing(false)
	if _, ok := waitFor(ctx, 10*time.Second, func() bool {
		return scrape(t, metricsURL, `onehop_webhook_requests_total{outcome="success"}`) != success
	}); !ok {
		t.Errorf("the retry after the receiver recovered was not counted a success")
	}
	if v := scrape(t, metricsURL, `onehop_webhook_requests_total{outcome="unreachable"}`); v != "0" {
		t.Errorf(`onehop_webhook_requests_total{outcome="unreachable"} = %q, want 0: the receiver always answered`, v)
	}

	// A second Service takes another of main's addresses.
	createLB(t, c, "api", 81)
	lbIPs(t, c, "api", "allocation", some)
	if _, ok := waitFor(ctx, 10*time.Second, func() bool {
		return scrape(t, metricsURL, `onehop_allocator_addresses_in_use_total{pool="main"}`) == "2"
	}); !ok {
		t.Errorf("onehop_allocator_addresses_in_use_total{pool=\"main\"} = %q after a second Service, want 2",
			scrape(t, metricsURL, `onehop_allocator_addresses_in_use_total{pool="main"}`))
	}
}

// serveLoopback runs serve on a loopback listener until ctx ends and
// returns its base URL.
func serveLoopback(ctx context.Context, t *testing.T, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = serve(ctx, ln) }()
	t.Cleanup(func() { <-done })
	return "http://" + ln.Addr().String()
}

// providerFailures GETs url (an agent's /healthz) and returns its status
// code and providerFailures.
func providerFailures(t *testing.T, url string) (int, map[string]string) {
	t.Helper()
	code, b := httpGet(t, url)
	var body struct {
		ProviderFailures map[string]string `json:"providerFailures"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("%s: %q: %v", url, b, err)
	}
	return code, body.ProviderFailures
}

// scrape returns the value of series (name{labels} as exposed) from the
// metrics at url, or "".
func scrape(t *testing.T, url, series string) string {
	t.Helper()
	_, b := httpGet(t, url)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// nodeEvents counts the occurrences of events of reason on Node node.
func nodeEvents(t *testing.T, c kubernetes.Interface, node, reason string) int {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "Node" && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// TestL2ProviderMissingInterface: an agent (hookMain, in node1's namespace)
// whose l2 interface lan0 does not exist keeps running and puts a
// ProviderFailed event naming lan0 on its Node; once lan0 exists (a veth to
// a client) the responder starts on its next try, the Node gets
// ProviderRecovered, and the client's ARP for the VIP is answered from
// lan0.
func TestL2ProviderMissingInterface(t *testing.T) {
	needs(t)
	lab := newTopo(t)
	lab.add("cp", "node1", "client")
	lab.veth("cp", "eth0", "node1", "eth0")
	lab.ip("cp", "addr", "add", "10.0.0.2/24", "dev", "eth0")
	lab.ip("node1", "addr", "add", "10.0.0.11/24", "dev", "eth0")
	cp, c := lab.startControlPlane("cp", "10.0.0.2")
	createReadyNode(t, c, "node1", "10.0.0.11")
	cfg := config.Config{
		Pools:          []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		LeaseNamespace: "default",
		L2:             &l2.Config{Interfaces: []string{"lan0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5},
	}
	lab.startAgent("node1", cfg, cp.Kubeconfig)
	if msg := eventIn(t, c, "default", "node1", "ProviderFailed"); !strings.Contains(msg, "l2") || !strings.Contains(msg, "lan0") {
		t.Fatalf("ProviderFailed on node1: %q; want the provider and the interface named", msg)
	}
	createLB(t, c, "web", 80)
	lbIPs(t, c, "web", "allocation", some)
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2"})

	lab.veth("node1", "lan0", "client", "eth0")
	lab.ip("node1", "addr", "add", "10.1.0.1/24", "dev", "lan0")
	lab.ip("client", "addr", "add", "10.1.0.100/24", "dev", "eth0")
	lab.ip("client", "route", "add", vip+"/32", "dev", "eth0")
	eventIn(t, c, "default", "node1", "ProviderRecovered")
	want := lab.mac("node1", "lan0")
	if _, ok := waitFor(context.Background(), 15*time.Second, func() bool {
		_, _ = lab.get("client", vip+":80") // resolves the VIP; nothing listens
		return lab.neigh(vip) == want
	}); !ok {
		t.Fatalf("client's entry for %s is %q, want node1's lan0 %s", vip, lab.neigh(vip), want)
	}
	if n := nodeEvents(t, c, "node1", "ProviderFailed"); n != 1 {
		t.Fatalf("%d ProviderFailed events on node1, want 1", n)
	}
}
