package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/osrg/gobgp/v4/api"
)

// SetPeers makes the running speaker's peers peers, in place: a new peer
// is added, a peer no longer listed is deleted, and a peer whose settings
// changed (a password, its hold time) is deleted and added again, which
// resets its session alone. The other sessions stay up, and a peer added
// gets every route announced now (one with graceful restart once the
// speaker is Ready). The ASN, router ID, listen port and next
// hops cannot change this way (a new speaker is needed). On an error the
// speaker's peers are as far as the change went; stop it and start a new
// one.
func (s *Speaker) SetPeers(ctx context.Context, peers []Peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.srv == nil {
		return errors.New("bgp: speaker not running")
	}
	next := s.cfg
	next.Peers = peers
	if err := next.Validate(); err != nil {
		return err
	}
	byAddr := func(ps []Peer) map[netip.Addr]Peer {
		m := map[netip.Addr]Peer{}
		for _, p := range ps {
			m[netip.MustParseAddr(p.Address)] = p // Validate parsed them
		}
		return m
	}
	had, want := byAddr(s.cfg.Peers), byAddr(peers)
	for a, p := range had {
		if q, ok := want[a]; ok && q == p {
			continue
		}
		if _, held := s.held[a]; held {
			delete(s.held, a) // never given to GoBGP
			continue
		}
		if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: a.String()}); err != nil {
			return fmt.Errorf("bgp: delete peer %s: %w", a, err)
		}
		s.log.Info("bgp peer removed", "peer", a)
	}
	for a, p := range want {
		if q, ok := had[a]; ok && q == p {
			continue
		}
		if s.holdLocked(p) {
			continue
		}
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peer(p)}); err != nil {
			return fmt.Errorf("bgp: peer %s: %w", a, err)
		}
		s.log.Info("bgp peer added", "peer", a)
	}
	s.cfg.Peers = slices.Clone(peers)
	return nil
}
