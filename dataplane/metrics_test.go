package dataplane

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// startMetrics serves the metrics of reg on loopback until the test ends.
func startMetrics(t *testing.T, m *Metrics, reg prometheus.Gatherer, profiling bool) string {
	return serveLoopback(t, func(ctx context.Context, ln net.Listener) error {
		return m.ServeListener(ctx, ln, reg, profiling)
	})
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	code, _, body := fetch(t, url)
	return code, body
}

func TestMetricsScrapeAfterSyncs(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	m.now = func() time.Time { return time.Unix(1_700_000_123, 500_000_000) }
	base := startMetrics(t, m, reg, false)

	m.ObserveSync(SyncStats{Full: true, Services: 3, Changed: 5, Messages: 7, Rules: 42, Elements: 99,
		Duration: 3 * time.Millisecond, CPU: 2 * time.Millisecond}, nil)
	m.ObserveSync(SyncStats{Full: false, Changed: 1, Messages: 2, Rules: 43, Elements: 100,
		Duration: time.Millisecond}, nil)
	// A failed sync counts, but leaves the ruleset sizes and the last-sync time alone.
	m.ObserveSync(SyncStats{Full: false, Rules: 1, Elements: 1, Duration: time.Millisecond}, errors.New("EBUSY"))
	m.ObserveProgramming(1500 * time.Millisecond)
	m.ObserveProgramming(-time.Second) // clock skew: counted as 0
	m.EndpointChanges(4)
	m.ServiceChanges(2)
	m.NoLocalEndpoints("ipv4", true, 3)
	m.NoLocalEndpoints("ipv6", false, 1)

	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d: %s", code, body)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		lines[l] = true
	}
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count 3`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.004"} 3`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7000001235e+09`,
		`kubeproxy_network_programming_duration_seconds_count 2`,
		`kubeproxy_network_programming_duration_seconds_bucket{le="0.25"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{le="2"} 2`,
		`kubeproxy_network_programming_duration_seconds_bucket{le="300"} 2`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 4`,
		`kubeproxy_sync_proxy_rules_service_changes_total 2`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 3`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 1`,
		`kubeproxy_proxy_healthz_total{code="200"} 0`,
		`onehop_rules 43`,
		`onehop_map_elements 100`,
		`onehop_syncs_total{mode="full"} 1`,
		`onehop_syncs_total{mode="partial"} 2`,
		`onehop_sync_failures_total{mode="full"} 0`,
		`onehop_sync_failures_total{mode="partial"} 1`,
		`onehop_sync_changed_portals_total 6`,
		`onehop_sync_messages_total 9`,
		`onehop_sync_cpu_seconds_total{mode="full"} 0.002`,
		`onehop_sync_cpu_seconds_total{mode="partial"} 0`,
	} {
		if !lines[want] {
			t.Errorf("scrape lacks %q", want)
		}
	}
	for _, prefix := range []string{"go_goroutines ", "process_start_time_seconds "} {
		if !strings.Contains(body, "\n"+prefix) {
			t.Errorf("scrape lacks %s", prefix)
		}
	}

	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without profiling = %d, want 404", code)
	}
}

func TestMetricsProfiling(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	base := startMetrics(t, m, reg, true)
	code, body := get(t, base+"/debug/pprof/")
	if code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ with profiling = %d, body lacks goroutine profile", code)
	}
	if code, _ := get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Errorf("/debug/pprof/goroutine = %d", code)
	}
}

// /proxyMode answers the dataplane's name, as kube-proxy's metrics server
// does; without one set there is no such page.
func TestMetricsProxyMode(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	base := startMetrics(t, m, reg, false)
	if code, body := get(t, base+"/proxyMode"); code != http.StatusNotFound {
		t.Errorf("/proxyMode with no mode set = %d %q, want 404", code, body)
	}
	reg2 := prometheus.NewRegistry()
	m2 := NewMetrics(reg2)
	m2.SetProxyMode("nftables")
	base = startMetrics(t, m2, reg2, false)
	if code, body := get(t, base+"/proxyMode"); code != http.StatusOK || body != "nftables" {
		t.Errorf("/proxyMode = %d %q, want 200 nftables", code, body)
	}
}

func TestMetricsNil(t *testing.T) {
	var m *Metrics // metrics disabled: every call is a no-op
	m.ObserveSync(SyncStats{Full: true}, nil)
	m.ObserveProgramming(time.Second)
	m.EndpointChanges(1)
	m.ServiceChanges(1)
	m.NoLocalEndpoints("ipv4", false, 1)
}

func TestMetricsServeBadAddress(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	err := m.Serve(context.Background(), "256.0.0.1:10249", reg, false)
	if err == nil || !strings.Contains(err.Error(), "256.0.0.1:10249") {
		t.Fatalf("Serve on a bad address: %v, want an error naming it", err)
	}
}
