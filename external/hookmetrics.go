package external

import (
	"errors"
	"math"
	"net/url"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/webhook"
)

// The hook's metrics (dataplane's hookMetrics, on the registry
// WithProviderHealth gives): what each provider announces, each BGP
// session's state (bgpsessions.go), the pools' addresses on the holder of
// the allocator Lease, and the webhook sender's requests.

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
