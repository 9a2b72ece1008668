package external

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/webhook"
)

// gauge returns the value of the series of name with label=value in reg,
// and whether it exists.
func gauge(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// providerDetail is /healthz's providerFailures.
func providerDetail(t *testing.T, hs *dataplane.HealthServer) map[string]string {
	t.Helper()
	w := httptest.NewRecorder()
	hs.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	var body struct {
		ProviderFailures map[string]string `json:"providerFailures"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("/healthz %q: %v", w.Body.String(), err)
	}
	return body.ProviderFailures
}

// drain returns the events the fake recorder holds now.
func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A failing provider is reported once per distinct failure, backs off 1s
// doubling to 30s, and its recovery clears the health detail, sets the
// gauge and is reported once.
func TestProviderHealthReportsAndBacksOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	hs := dataplane.NewHealthServer("127.0.0.1:0", time.Second, nil)
	rec := record.NewFakeRecorder(100)
	p := providerHealth{node: "node1", log: slog.New(slog.NewTextHandler(io.Discard, nil)), rec: rec, health: hs, metrics: dataplane.NewMetrics(reg)}
	p.pending("l2")
	if v, ok := gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "l2"}); !ok || v != 0 {
		t.Fatalf("onehop_provider_up{l2} before the start = %v (exists %v), want 0", v, ok)
	}

	now := time.Unix(1000, 0)
	errNoIface := errors.New("l2: route ip+net: no such network interface")
	var waits []time.Duration
	for range 7 {
		next := p.failed("l2", stageStart, errNoIface, now)
		waits = append(waits, next.Sub(now))
		if p.due("l2", now) || !p.due("l2", next) {
			t.Fatalf("due before %v or not at it", next)
		}
		now = next
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("back-off %v, want %v", waits, want)
		}
	}
	ev := drain(rec)
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning ProviderFailed ") || !strings.Contains(ev[0], "no such network interface") {
		t.Fatalf("events after 7 equal failures: %q, want one ProviderFailed naming the error", ev)
	}
	if d := providerDetail(t, hs); d["l2"] != "start: "+errNoIface.Error() {
		t.Fatalf("/healthz providerFailures %v, want l2's start error", d)
	}
	if v, _ := gauge(t, reg, "onehop_provider_failures_total", map[string]string{"provider": "l2", "stage": "start"}); v != 7 {
		t.Fatalf("onehop_provider_failures_total{l2,start} = %v, want 7", v)
	}

	// Another failure is another event.
	p.failed("l2", stageStart, errors.New("l2: interface eth9 has neither an IPv4 address"), now)
	if ev := drain(rec); len(ev) != 1 || !strings.Contains(ev[0], "eth9") {
		t.Fatalf("events after a different failure: %q, want one naming it", ev)
	}

	p.ok("l2")
	if ev := drain(rec); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal ProviderRecovered ") {
		t.Fatalf("events on recovery: %q, want one ProviderRecovered", ev)
	}
	if d := providerDetail(t, hs); len(d) != 0 {
		t.Fatalf("/healthz providerFailures after recovery: %v, want none", d)
	}
	if v, _ := gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "l2"}); v != 1 {
		t.Fatalf("onehop_provider_up{l2} after recovery = %v, want 1", v)
	}
	p.ok("l2")
	if ev := drain(rec); len(ev) != 0 {
		t.Fatalf("events on a second success: %q, want none", ev)
	}
	// After a recovery the back-off starts over.
	if next := p.failed("l2", stageUpdate, errNoIface, now); next.Sub(now) != time.Second {
		t.Fatalf("back-off after a recovery: %v, want 1s", next.Sub(now))
	}
}

// A webhook whose secret file is missing does not stop the hook: it is
// reported (event on the Node, metric, /healthz detail) and started once
// the file appears, and its recovery is reported.
func TestProviderStartRetried(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	c := fake.NewClientset()
	reg := prometheus.NewRegistry()
	hs := dataplane.NewHealthServer("127.0.0.1:0", time.Second, nil)
	cfg := Config{LeaseNamespace: "default", Webhook: &webhook.Config{URL: "https://127.0.0.1:1/hook", SecretFile: secret}}
	h, err := New(cfg, c, "node1", slog.New(slog.NewTextHandler(io.Discard, nil)), WithProviderHealth(hs, dataplane.NewMetrics(reg)))
	if err != nil {
		t.Fatal(err)
	}
	runHook(t, h)
	waitFor(t, "a ProviderFailed event on node1", func() bool { return nodeEvent(t, c, "ProviderFailed") != "" })
	if msg := nodeEvent(t, c, "ProviderFailed"); !strings.Contains(msg, "webhook") || !strings.Contains(msg, secret) {
		t.Fatalf("ProviderFailed %q: want the provider and the missing file named", msg)
	}
	if d := providerDetail(t, hs); !strings.HasPrefix(d["webhook"], "start: ") {
		t.Fatalf("/healthz providerFailures %v, want webhook's start error", d)
	}
	if v, _ := gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "webhook"}); v != 0 {
		t.Fatalf("onehop_provider_up{webhook} = %v while failing, want 0", v)
	}
	waitFor(t, "a second start attempt", func() bool {
		v, _ := gauge(t, reg, "onehop_provider_failures_total", map[string]string{"provider": "webhook", "stage": "start"})
		return v >= 2
	})
	if n := countNodeEvents(t, c, "ProviderFailed"); n != 1 {
		t.Fatalf("%d ProviderFailed events after retries of one failure, want 1", n)
	}

	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ProviderRecovered event on node1", func() bool { return nodeEvent(t, c, "ProviderRecovered") != "" })
	if v, _ := gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "webhook"}); v != 1 {
		t.Fatalf("onehop_provider_up{webhook} = %v after the start, want 1", v)
	}
	if d := providerDetail(t, hs); len(d) != 0 {
		t.Fatalf("/healthz providerFailures after recovery: %v, want none", d)
	}
}

// nodeEvent returns the message of an event of reason on Node node1, or "".
func nodeEvent(t *testing.T, c *fake.Clientset, reason string) string {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "node1" && e.Reason == reason {
			return e.Message
		}
	}
	return ""
}

// countNodeEvents counts the occurrences of events of reason on node1
// (an event repeated by the recorder counts its Count).
func countNodeEvents(t *testing.T, c *fake.Clientset, reason string) int {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == "node1" && e.Reason == reason {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
