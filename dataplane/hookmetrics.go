package dataplane

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// hookMetrics are the cloud hook's metrics (package external). Where one
// means what a MetalLB metric means, it has that metric's name with
// onehop_ for metallb_, so that MetalLB's dashboards and alerts carry over
// with the prefix changed: onehop_bgp_session_up,
// onehop_bgp_announced_prefixes_total,
// onehop_allocator_addresses_in_use_total and
// onehop_allocator_addresses_total (gauges, despite the _total MetalLB
// gave them).
type hookMetrics struct {
	announced   *prometheus.GaugeVec
	sessionUp   *prometheus.GaugeVec
	prefixes    *prometheus.GaugeVec
	poolInUse   *prometheus.GaugeVec
	poolTotal   *prometheus.GaugeVec
	webhookReqs *prometheus.CounterVec

	mu    sync.Mutex
	pools map[string]bool // the pools with series now
}

// The outcomes of onehop_webhook_requests_total.
const (
	WebhookSuccess     = "success"     // a 2xx answer
	WebhookRejected    = "rejected"    // another answer
	WebhookUnreachable = "unreachable" // none: connection, TLS, timeout
)

func newHookMetrics() *hookMetrics {
	return &hookMetrics{
		announced: newGaugeVec("onehop_announced_ips",
			"IPs this node's provider (bgp, l2) announces now, or the webhook sender last sent (webhook, on the leader). "+
				"Desired state: a BGP router may not have converged on it yet.",
			"provider"),
		sessionUp: newGaugeVec("onehop_bgp_session_up",
			"1 while this node's BGP session with the peer is established, 0 while it is not; no series for a peer not configured here.",
			"peer"),
		prefixes: newGaugeVec("onehop_bgp_announced_prefixes_total",
			"Prefixes this node announces on its BGP session with the peer now: every address it announces while the session is established, 0 while not.",
			"peer"),
		poolInUse: newGaugeVec("onehop_allocator_addresses_in_use_total",
			"IP addresses of the pool that Services hold, on the holder of the allocator Lease (no series elsewhere).",
			"pool"),
		poolTotal: newGaugeVec("onehop_allocator_addresses_total",
			"Usable IP addresses of the pool, on the holder of the allocator Lease (no series elsewhere).",
			"pool"),
		webhookReqs: newCounterVec("onehop_webhook_requests_total",
			"Requests the webhook sender made, each retry counted, by outcome: success (a 2xx answer), "+
				"rejected (another answer) or unreachable (no answer: connection, TLS, timeout).",
			"outcome"),
		pools: map[string]bool{},
	}
}

func (h *hookMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{h.announced, h.sessionUp, h.prefixes, h.poolInUse, h.poolTotal, h.webhookReqs}
}

// Announced sets onehop_announced_ips of provider to n.
func (m *Metrics) Announced(provider string, n int) {
	if m == nil {
		return
	}
	m.hook.announced.WithLabelValues(provider).Set(float64(n))
}

// BGPSession sets onehop_bgp_session_up of peer, and
// onehop_bgp_announced_prefixes_total to prefixes.
func (m *Metrics) BGPSession(peer string, up bool, prefixes int) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.hook.sessionUp.WithLabelValues(peer).Set(v)
	m.hook.prefixes.WithLabelValues(peer).Set(float64(prefixes))
}

// BGPSessionGone removes peer's series: it is no longer configured, or
// the speaker stopped.
func (m *Metrics) BGPSessionGone(peer string) {
	if m == nil {
		return
	}
	m.hook.sessionUp.DeleteLabelValues(peer)
	m.hook.prefixes.DeleteLabelValues(peer)
}

// PoolAddresses are one pool's addresses: in use and usable in all.
type PoolAddresses struct{ InUse, Total int64 }

// Pools sets the allocator's gauges to pools, exactly: a pool not named
// loses its series, and nil (a process that does not hold the allocator
// Lease) leaves none.
func (m *Metrics) Pools(pools map[string]PoolAddresses) {
	if m == nil {
		return
	}
	h := m.hook
	h.mu.Lock()
	defer h.mu.Unlock()
	for name := range h.pools {
		if _, ok := pools[name]; !ok {
			h.poolInUse.DeleteLabelValues(name)
			h.poolTotal.DeleteLabelValues(name)
			delete(h.pools, name)
		}
	}
	for name, p := range pools {
		h.poolInUse.WithLabelValues(name).Set(float64(p.InUse))
		h.poolTotal.WithLabelValues(name).Set(float64(p.Total))
		h.pools[name] = true
	}
}

// WebhookRequests counts n requests of the webhook sender with outcome
// (WebhookSuccess, WebhookRejected, WebhookUnreachable); n 0 makes the
// series exist.
func (m *Metrics) WebhookRequests(outcome string, n int) {
	if m == nil || n < 0 {
		return
	}
	m.hook.webhookReqs.WithLabelValues(outcome).Add(float64(n))
}
