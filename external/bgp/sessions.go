package bgp

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Session is a change of one of the speaker's BGP sessions, as OnSession
// reports it.
type Session struct {
	Peer netip.Addr
	ASN  uint32
	// Up: the session is established now; WasUp: it was at the previous
	// report of this peer (false at the first).
	Up, WasUp bool
	// Gone: the peer is no longer configured (SetPeers removed it) or the
	// speaker stopped; this is the peer's last report.
	Gone bool
	// Reason says why a session left the established state, when known.
	Reason string
}

// OnSession makes the speaker call fn for each peer when it first sees
// it, whenever its session is established or leaves that state, and when
// the peer goes away (Session.Gone; for every peer when the speaker
// stops). The other states a session passes through (Connect, Active,
// OpenSent, ...) are not reported: a session that cannot come up is one
// report, not one per attempt. Call it before Start. fn is called one
// report at a time, in order, from GoBGP's goroutine and from Stop; it
// must not call the speaker.
func (s *Speaker) OnSession(fn func(Session)) { s.sessions.fn = fn }

// sessions follows the speaker's sessions from GoBGP's peer events and
// reports what OnSession promises; it lives as long as the speaker.
type sessions struct {
	mu     sync.Mutex
	fn     func(Session)
	known  map[netip.Addr]Session // the last report of each peer
	closed bool
}

// observe takes one peer event: the peer's session is established or
// not, and the peer is still configured or not.
func (t *sessions) observe(peer netip.Addr, asn uint32, established, configured bool, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.fn == nil {
		return
	}
	last, known := t.known[peer]
	switch {
	case !configured:
		if known {
			delete(t.known, peer)
			t.fn(Session{Peer: peer, ASN: last.ASN, WasUp: last.Up, Gone: true, Reason: "peer no longer configured"})
		}
		return
	case known && last.Up == established:
		return
	}
	if t.known == nil {
		t.known = map[netip.Addr]Session{}
	}
	cur := Session{Peer: peer, ASN: asn, Up: established, WasUp: last.Up}
	if !established && last.Up {
		cur.Reason = reason
	}
	t.known[peer] = cur
	t.fn(cur)
}

// close reports every peer gone (the speaker stopped) and ignores what
// comes after.
func (t *sessions) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	if t.fn == nil {
		return
	}
	for peer, last := range t.known {
		t.fn(Session{Peer: peer, ASN: last.ASN, WasUp: last.Up, Gone: true, Reason: "speaker stopped"})
	}
	t.known = nil
}

// watch follows srv's peer events until ctx ends: each state change is
// logged and given to s.sessions.
func (s *Speaker) watch(ctx context.Context, srv *server.BgpServer) error {
	return srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(p *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if p.Type != apiutil.PEER_EVENT_STATE && p.Type != apiutil.PEER_EVENT_INIT {
				return
			}
			st := p.Peer.State
			if p.Type == apiutil.PEER_EVENT_STATE {
				s.log.Info("bgp peer state", "peer", st.NeighborAddress, "state", st.SessionState.String())
			}
			reason := disconnectReason(st.DisconnectReason, st.DisconnectMessage)
			if p.Type == apiutil.PEER_EVENT_STATE && st.AdminState == api.PeerState_ADMIN_STATE_PFX_CT &&
				st.SessionState == bgp.BGP_FSM_IDLE {
				reason = s.overPrefixLimit(st.NeighborAddress.Unmap())
			}
			s.sessions.observe(st.NeighborAddress.Unmap(), st.PeerASN, st.SessionState == bgp.BGP_FSM_ESTABLISHED,
				s.configured(st.NeighborAddress), reason)
		}}, server.WatchPeer())
}

// configured reports whether peer is one of the running speaker's peers.
func (s *Speaker) configured(peer netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	for _, p := range s.cfg.Peers {
		if a, err := netip.ParseAddr(p.Address); err == nil && a.Unmap() == peer.Unmap() {
			return true
		}
	}
	return false
}

// disconnectReason spells GoBGP's reason for a session's end, e.g.
// "hold timer expired" or "notification received: ...".
func disconnectReason(r api.PeerState_DisconnectReason, msg string) string {
	if r == api.PeerState_DISCONNECT_REASON_UNSPECIFIED {
		return msg
	}
	s := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(r.String(), "DISCONNECT_REASON_")), "_", " ")
	if msg != "" {
		s += ": " + msg
	}
	return s
}
