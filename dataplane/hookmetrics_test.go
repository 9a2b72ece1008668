package dataplane

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHookMetrics: the cloud hook's metrics as a scrape shows them. A pool
// dropped from Pools loses its series, nil leaves none (a process that
// stopped leading); a BGP peer gone loses its series; webhook requests
// add up by outcome.
func TestHookMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	base := startMetrics(t, m, reg, false)
	scrape := func() map[string]bool {
		t.Helper()
		code, body := get(t, base+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics = %d: %s", code, body)
		}
		lines := map[string]bool{}
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "onehop_announced") || strings.HasPrefix(l, "onehop_bgp") ||
				strings.HasPrefix(l, "onehop_allocator") || strings.HasPrefix(l, "onehop_webhook") {
				lines[l] = true
			}
		}
		return lines
	}
	expect := func(what string, want ...string) {
		t.Helper()
		got := scrape()
		for _, w := range want {
			if !got[w] {
				t.Errorf("%s: no line %q in %v", what, w, got)
			}
			delete(got, w)
		}
		if len(got) > 0 {
			t.Errorf("%s: unexpected lines %v", what, got)
		}
	}

	m.Announced("bgp", 3)
	m.Announced("l2", 0)
	m.BGPSession("10.0.0.1", true, 3)
	m.BGPSession("10.0.0.3", false, 0)
	m.Pools(map[string]PoolAddresses{"main": {InUse: 1, Total: 3}, "manual": {InUse: 0, Total: 2}})
	m.WebhookRequests(WebhookSuccess, 0)
	m.WebhookRequests(WebhookUnreachable, 2)
	m.WebhookRequests(WebhookSuccess, 1)
	expect("first",
		`onehop_announced_ips{provider="bgp"} 3`,
		`onehop_announced_ips{provider="l2"} 0`,
		`onehop_bgp_session_up{peer="10.0.0.1"} 1`,
		`onehop_bgp_session_up{peer="10.0.0.3"} 0`,
		`onehop_bgp_announced_prefixes_total{peer="10.0.0.1"} 3`,
		`onehop_bgp_announced_prefixes_total{peer="10.0.0.3"} 0`,
		`onehop_allocator_addresses_in_use_total{pool="main"} 1`,
		`onehop_allocator_addresses_total{pool="main"} 3`,
		`onehop_allocator_addresses_in_use_total{pool="manual"} 0`,
		`onehop_allocator_addresses_total{pool="manual"} 2`,
		`onehop_webhook_requests_total{outcome="success"} 1`,
		`onehop_webhook_requests_total{outcome="unreachable"} 2`,
	)

	m.BGPSession("10.0.0.1", false, 0)
	m.BGPSessionGone("10.0.0.3")
	m.Pools(map[string]PoolAddresses{"main": {InUse: 2, Total: 3}})
	expect("after changes",
		`onehop_announced_ips{provider="bgp"} 3`,
		`onehop_announced_ips{provider="l2"} 0`,
		`onehop_bgp_session_up{peer="10.0.0.1"} 0`,
		`onehop_bgp_announced_prefixes_total{peer="10.0.0.1"} 0`,
		`onehop_allocator_addresses_in_use_total{pool="main"} 2`,
		`onehop_allocator_addresses_total{pool="main"} 3`,
		`onehop_webhook_requests_total{outcome="success"} 1`,
		`onehop_webhook_requests_total{outcome="unreachable"} 2`,
	)

	m.Pools(nil)
	expect("no longer leading",
		`onehop_announced_ips{provider="bgp"} 3`,
		`onehop_announced_ips{provider="l2"} 0`,
		`onehop_bgp_session_up{peer="10.0.0.1"} 0`,
		`onehop_bgp_announced_prefixes_total{peer="10.0.0.1"} 0`,
		`onehop_webhook_requests_total{outcome="success"} 1`,
		`onehop_webhook_requests_total{outcome="unreachable"} 2`,
	)

	var nilm *Metrics // a hook without metrics
	nilm.Announced("bgp", 1)
	nilm.BGPSession("10.0.0.1", true, 1)
	nilm.BGPSessionGone("10.0.0.1")
	nilm.Pools(map[string]PoolAddresses{"main": {}})
	nilm.WebhookRequests(WebhookRejected, 1)
}
