package providers

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/internal/hooktest"
)

// A failing provider is reported once per distinct failure, backs off 1s
// doubling to 30s, and its recovery clears the health detail, sets the
// gauge and is reported once.
func TestProviderHealthReportsAndBacksOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	hs := dataplane.NewHealthServer("127.0.0.1:0", time.Second, nil)
	rec := record.NewFakeRecorder(100)
	p := Health{node: "node1", log: slog.New(slog.NewTextHandler(io.Discard, nil)), rec: rec, health: hs, metrics: dataplane.NewMetrics(reg)}
	p.Pending("l2")
	if v, ok := hooktest.Gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "l2"}); !ok || v != 0 {
		t.Fatalf("onehop_provider_up{l2} before the start = %v (exists %v), want 0", v, ok)
	}

	now := time.Unix(1000, 0)
	errNoIface := errors.New("l2: route ip+net: no such network interface")
	var waits []time.Duration
	for range 7 {
		next := p.Failed("l2", StageStart, errNoIface, now)
		waits = append(waits, next.Sub(now))
		if p.Due("l2", now) || !p.Due("l2", next) {
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
	ev := hooktest.Drain(rec)
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning ProviderFailed ") || !strings.Contains(ev[0], "no such network interface") {
		t.Fatalf("events after 7 equal failures: %q, want one ProviderFailed naming the error", ev)
	}
	if d := hooktest.ProviderDetail(t, hs); d["l2"] != "start: "+errNoIface.Error() {
		t.Fatalf("/healthz providerFailures %v, want l2's start error", d)
	}
	if v, _ := hooktest.Gauge(t, reg, "onehop_provider_failures_total", map[string]string{"provider": "l2", "stage": "start"}); v != 7 {
		t.Fatalf("onehop_provider_failures_total{l2,start} = %v, want 7", v)
	}

	// Another failure is another event.
	p.Failed("l2", StageStart, errors.New("l2: interface eth9 has neither an IPv4 address"), now)
	if ev := hooktest.Drain(rec); len(ev) != 1 || !strings.Contains(ev[0], "eth9") {
		t.Fatalf("events after a different failure: %q, want one naming it", ev)
	}

	p.OK("l2")
	if ev := hooktest.Drain(rec); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal ProviderRecovered ") {
		t.Fatalf("events on recovery: %q, want one ProviderRecovered", ev)
	}
	if d := hooktest.ProviderDetail(t, hs); len(d) != 0 {
		t.Fatalf("/healthz providerFailures after recovery: %v, want none", d)
	}
	if v, _ := hooktest.Gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "l2"}); v != 1 {
		t.Fatalf("onehop_provider_up{l2} after recovery = %v, want 1", v)
	}
	p.OK("l2")
	if ev := hooktest.Drain(rec); len(ev) != 0 {
		t.Fatalf("events on a second success: %q, want none", ev)
	}
	// After a recovery the back-off starts over.
	if next := p.Failed("l2", StageUpdate, errNoIface, now); next.Sub(now) != time.Second {
		t.Fatalf("back-off after a recovery: %v, want 1s", next.Sub(now))
	}
}
