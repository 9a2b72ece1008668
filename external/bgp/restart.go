package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/osrg/gobgp/v4/api"
)

// Graceful restart (RFC 4724) with a router that helps, as BIRD and FRR do
// by default: when a session that negotiated it ends without a
// NOTIFICATION (the agent's TCP connection closes, the agent is killed),
// the router keeps the node's routes as stale for the restart time the
// speaker advertised, and forwards along them; the node's dataplane, which
// an agent's restart leaves in the kernel, goes on serving. The speaker
// started again says in its OPEN that it restarted and that it kept the
// forwarding state of each family (the R and F bits), so that the router
// keeps the stale routes; it announces the routes again and ends each
// family with End-of-RIB, on which the router drops the stale routes not
// announced again. The End-of-RIB must therefore not leave before the
// routes the node serves are all announced: the peers with graceful
// restart are given to GoBGP only once the speaker is Ready.

// restartTime is the restart time p advertises.
func (p Peer) restartTime() uint16 {
	if p.GracefulRestartSeconds == 0 {
		return DefaultRestartSeconds
	}
	return p.GracefulRestartSeconds
}

// gracefulRestart makes pc, p's GoBGP peer, advertise graceful restart
// when p has it.
func gracefulRestart(pc *api.Peer, p Peer) {
	if !p.GracefulRestart {
		return
	}
	pc.GracefulRestart = &api.GracefulRestart{
		Enabled:     true,
		RestartTime: uint32(p.restartTime()),
		// The R and F bits. GoBGP sets F only with R; without F the
		// router drops the stale routes as soon as the session is back
		// (RFC 4724 4.2), before they are announced again. F is true:
		// the dataplane kept forwarding. With R, GoBGP also holds its
		// UPDATEs until the router's End-of-RIB, or DeferralTime: the
		// speaker takes no route from its peers, so waiting longer for
		// them serves nothing.
		LocalRestarting: true,
		DeferralTime:    1,
		// No N bit (RFC 8538): a NOTIFICATION the speaker sends (a
		// peer deleted, too many prefixes) ends graceful restart and the
		// router drops the routes at once, as it does without the
		// capability. BIRD does not negotiate it anyway.
		NotificationEnabled: false,
	}
	for _, af := range pc.AfiSafis {
		af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
}

// hold keeps p from GoBGP until the speaker is Ready when p has graceful
// restart, and reports whether it did.
func (s *Speaker) hold(p Peer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdLocked(p)
}

func (s *Speaker) holdLocked(p Peer) bool {
	if !p.GracefulRestart || s.ready {
		return false
	}
	if s.held == nil {
		s.held = map[netip.Addr]Peer{}
	}
	s.held[netip.MustParseAddr(p.Address)] = p // Validate parsed it
	s.log.Info("bgp peer waits for the node's routes (graceful restart)", "peer", p.Address)
	return true
}

// Ready tells the speaker that the routes set so far (SetRoutes) are all
// the node serves, not what an agent just started knows of them: the peers
// with graceful restart, held back until now, are given to GoBGP, which
// sends them those routes and End-of-RIB once their sessions are up. The
// first call does it; on an error the peers not added are tried again at
// the next call.
func (s *Speaker) Ready(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.srv == nil {
		return errors.New("bgp: speaker not running")
	}
	s.ready = true
	var errs []error
	for a, p := range s.held {
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peer(p)}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: peer %s: %w", a, err))
			continue
		}
		delete(s.held, a)
		s.log.Info("bgp peer added with graceful restart", "peer", a, "restartSeconds", p.restartTime())
	}
	return errors.Join(errs...)
}

// StopForRestart stops the speaker as the agent stops, leaving the
// dataplane in place. With no peer configured for graceful restart it is
// Stop. Otherwise no route is withdrawn: GoBGP closes the sessions that
// negotiated graceful restart without a NOTIFICATION, so that their
// routers keep the routes as stale until the agent is back or the restart
// time passes (a Cease would make them drop the routes at once: RFC 4724
// without RFC 8538, and BIRD whatever the subcode), and ends the others
// with a Cease, on which their routers drop the routes.
func (s *Speaker) StopForRestart(ctx context.Context) error {
	s.mu.Lock()
	graceful := false
	for _, p := range s.cfg.Peers {
		graceful = graceful || p.GracefulRestart
	}
	if !graceful || s.stopped || s.srv == nil {
		s.mu.Unlock()
		return s.Stop(ctx)
	}
	s.stopped = true
	end := s.endWatch
	s.mu.Unlock()
	s.sessions.close()
	err := s.srv.StopBgp(ctx, &api.StopBgpRequest{AllowGracefulRestart: true})
	// srv.Stop stops what StopBgp leaves running (the BFD loop); the
	// StopBgp it makes first finds the server stopped, which GoBGP would
	// log as an error.
	s.gobgpLevel.Set(slog.LevelError + 1)
	s.srv.Stop()
	if end != nil {
		end()
	}
	s.log.Info("bgp stopped for a restart: sessions with graceful restart closed without a NOTIFICATION, their routes left to the routers")
	return err
}
