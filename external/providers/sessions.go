package external

import (
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
)

// Events on a node's Node object for its BGP sessions: each node's own
// session state, which no shared status holds (every node would write it).
const (
	reasonBGPSessionUp   = "BGPSessionEstablished"
	reasonBGPSessionDown = "BGPSessionDown"
)

// bgpSession records a change of one of this node's BGP sessions
// (bgp.Speaker.OnSession): the metrics follow every peer (bgpPeers), and
// a session established or no longer so gets a log line and an event on
// the Node. A speaker started again (reload) reports its peers afresh, so
// its events follow the speaker in force.
func (h *Hook) bgpSession(s bgp.Session) {
	h.bgpPeers.session(h.phealth.metrics, s)
	if s.Up == s.WasUp {
		return // first seen down, or gone while down: nothing came or went
	}
	if s.Up {
		h.log.Info("bgp session established", "peer", s.Peer, "asn", s.ASN)
		h.phealth.event(corev1.EventTypeNormal, reasonBGPSessionUp, "BGP session with %s (AS %d) established", s.Peer, s.ASN)
		return
	}
	why := ""
	if s.Reason != "" {
		why = ": " + s.Reason
	}
	h.log.Warn("bgp session down", "peer", s.Peer, "asn", s.ASN, "reason", s.Reason)
	h.phealth.event(corev1.EventTypeWarning, reasonBGPSessionDown, "BGP session with %s (AS %d) is down%s", s.Peer, s.ASN, why)
}

// bgpPeers is this node's BGP sessions as its metrics show them
// (onehop_bgp_session_up, onehop_bgp_announced_prefixes_total): whether
// each peer's session is up, and how many addresses the speaker announces,
// each of them on every established session. Session reports come from
// GoBGP's goroutine, the count from Run's.
type bgpPeers struct {
	mu        sync.Mutex
	up        map[netip.Addr]bool
	announced int
}

// session applies one report to the peer's series.
func (b *bgpPeers) session(m *dataplane.Metrics, s bgp.Session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.Gone {
		delete(b.up, s.Peer)
		m.BGPSessionGone(s.Peer.String())
		return
	}
	if b.up == nil {
		b.up = map[netip.Addr]bool{}
	}
	b.up[s.Peer] = s.Up
	m.BGPSession(s.Peer.String(), s.Up, b.prefixes(s.Up))
}

// setAnnounced records that the speaker announces n addresses now.
func (b *bgpPeers) setAnnounced(m *dataplane.Metrics, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n == b.announced {
		return
	}
	b.announced = n
	for peer, up := range b.up {
		m.BGPSession(peer.String(), up, b.prefixes(up))
	}
}

func (b *bgpPeers) prefixes(up bool) int {
	if up {
		return b.announced
	}
	return 0
}
