package providers

import (
	"net/netip"
	"sync"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
)

// BGPPeers is this node's BGP sessions as its metrics show them
// (onehop_bgp_session_up, onehop_bgp_announced_prefixes_total): whether
// each peer's session is up, and how many addresses the speaker announces,
// each of them on every established session. Session reports come from
// GoBGP's goroutine, the count from Run's.
type BGPPeers struct {
	mu        sync.Mutex
	up        map[netip.Addr]bool
	announced int
}

// Session applies one report to the peer's series.
func (b *BGPPeers) Session(m *dataplane.Metrics, s bgp.Session) {
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

// SetAnnounced records that the speaker announces n addresses now.
func (b *BGPPeers) SetAnnounced(m *dataplane.Metrics, n int) {
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

func (b *BGPPeers) prefixes(up bool) int {
	if up {
		return b.announced
	}
	return 0
}
