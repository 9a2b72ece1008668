package external

import (
	"errors"
	"math"
	"net/url"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/webhook"
)

// The hook's metrics (dataplane's hookMetrics, on the registry
// WithProviderHealth gives): what each provider announces, each BGP
// session's state (bgpsessions.go), the pools' addresses on the holder of
// the allocator Lease, and the webhook sender's requests. The L2
// heartbeats' are the hook's own (heartbeatCollector, on WithRegisterer's
// registry).

// announcing is a provider that can say how many IPs it announces now.
type announcing interface{ announced() int }

func (p *bgpProvider) announced() int     { return p.ips }
func (p *l2Provider) announced() int      { return len(p.r.Owned()) }
func (p *webhookProvider) announced() int { return p.sent }

// observeAnnounced sets onehop_announced_ips of p after an update, taken
// or not.
func (h *Hook) observeAnnounced(p Provider) {
	a, ok := p.(announcing)
	if !ok {
		return
	}
	n := a.announced()
	h.phealth.metrics.Announced(p.Name(), n)
	if b, ok := p.(*bgpProvider); ok {
		h.bgpPeers.setAnnounced(h.phealth.metrics, b.prefixes) // aggregates included
	}
}

// payloadIPs counts the distinct IPs of payloads.
func payloadIPs(payloads []webhook.Payload) int {
	seen := map[string]bool{}
	for _, pl := range payloads {
		for _, ip := range pl.IPs {
			seen[ip] = true
		}
	}
	return len(seen)
}

// observePools sets the allocator's gauges: each pool's addresses while
// this process holds the allocator Lease (leader), none otherwise.
func (h *Hook) observePools(leader bool) {
	if h.phealth.metrics == nil {
		return
	}
	if !leader {
		h.phealth.metrics.Pools(nil)
		return
	}
	h.phealth.metrics.Pools(poolAddresses(h.poolCounts()))
}

// poolAddresses turns poolCounts' used and free addresses into the
// gauges' in use and total, the total capped at the largest int64.
func poolAddresses(counts map[string][2]int64) map[string]dataplane.PoolAddresses {
	out := make(map[string]dataplane.PoolAddresses, len(counts))
	for name, c := range counts {
		total := c[0] + c[1]
		if c[1] > math.MaxInt64-c[0] {
			total = math.MaxInt64
		}
		out[name] = dataplane.PoolAddresses{InUse: c[0], Total: total}
	}
	return out
}

// webhookOutcome is the outcome of one webhook request that failed with
// err: no answer (the HTTP client's errors are *url.Error), or an answer
// other than 2xx.
func webhookOutcome(err error) string {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return dataplane.WebhookUnreachable
	}
	return dataplane.WebhookRejected
}

// WithRegisterer registers on reg the hook's metrics that it keeps itself
// (those of the L2 heartbeats), beside those WithProviderHealth's metrics
// hold. Without it they are not exposed.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(h *Hook) { h.registerer = reg }
}

// registerMetrics registers the hook's own collectors on h.registerer; a
// registry that holds them already (a hook built again on it) keeps the
// first.
func (h *Hook) registerMetrics() {
	if h.registerer == nil {
		return
	}
	if err := h.registerer.Register(newHeartbeatCollector(h)); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		h.log.Warn("l2 heartbeat metrics not registered", "err", err)
	}
}

// heartbeatCollector exposes the L2 heartbeats' state, read at each
// scrape: no series while heartbeats are off.
type heartbeatCollector struct {
	h                        *Hook
	peers, received, refused *prometheus.Desc
}

func newHeartbeatCollector(h *Hook) *heartbeatCollector {
	return &heartbeatCollector{h: h,
		peers: prometheus.NewDesc("onehop_l2_heartbeat_peers",
			"The other L2 nodes by their heartbeats now: alive, dead (missed them, or said they leave), or unheard "+
				"(none taken yet, or under a key this node lacks: judged by their Leases).", []string{"state"}, nil),
		received: prometheus.NewDesc("onehop_l2_heartbeats_received_total",
			"Heartbeat datagrams this node took from its peers.", nil, nil),
		refused: prometheus.NewDesc("onehop_l2_heartbeats_refused_total",
			"Heartbeat datagrams this node refused, by reason: bad_mac (under no key it holds), replay (not newer than "+
				"the last taken from that node), wrong_source (not from the node's address), not_peer (from a node with "+
				"no liveness Lease), malformed.", []string{"reason"}, nil),
	}
}

func (c *heartbeatCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.peers
	ch <- c.received
	ch <- c.refused
}

func (c *heartbeatCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.mu.Lock()
	hb := c.h.beats
	c.h.mu.Unlock()
	if hb == nil {
		return
	}
	st := hb.Stats()
	for state, n := range map[string]int{"alive": st.Alive, "dead": st.Dead, "unheard": st.Unheard} {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(st.Received))
	for _, reason := range []string{heartbeat.RefusedBadMAC, heartbeat.RefusedReplay, heartbeat.RefusedSource, heartbeat.RefusedNotPeer, heartbeat.RefusedMalformed} {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.Refused[reason]), reason)
	}
}
