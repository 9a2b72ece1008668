package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/osrg/gobgp/v4/api"
)

// The speaker's routing policy: it takes no route from its peers and
// announces only its own. GoBGP's defaults would take every route a peer
// sends into the speaker's RIB and pass it on to the other peers, making
// the node a transit path between two upstream routers.
//
// GoBGP keeps every route as received (each peer's Adj-RIB-In) before the
// import policy refuses it; a peer's prefix limit (Peer.MaxPrefixes)
// bounds that memory: a peer that sends more has its session ended.
const (
	// importPolicy and exportPolicy accept the node's own routes; all
	// others meet the default action, reject.
	importPolicy = "onehop-own-routes-in"
	exportPolicy = "onehop-own-routes-out"

	// DefaultMaxPrefixes is a peer's prefix limit, per address family,
	// when its MaxPrefixes is 0: far above what a router sends nodes (a
	// default route, a partial table), so that no session of an existing
	// install is cut on upgrade, and well below a full Internet table
	// (about a million IPv4 routes), whose Adj-RIB-In would take about
	// half a gigabyte; 100,000 routes hold about 50 MB.
	DefaultMaxPrefixes = 100000
	// prefixLimitWarnPercent of the limit gets a warning in the log.
	prefixLimitWarnPercent = 80
	// PrefixLimitRestart is how long a session ended by the prefix limit
	// stays down before the speaker tries it again (GoBGP alone would
	// leave it down for good).
	PrefixLimitRestart = 30 * time.Second
)

// setPolicy installs the policy in the running server. Local routes
// (AddPath) pass the import policy too, so both directions accept them.
func (s *Speaker) setPolicy(ctx context.Context) error {
	for _, p := range []struct {
		name string
		dir  api.PolicyDirection
	}{{importPolicy, api.PolicyDirection_POLICY_DIRECTION_IMPORT}, {exportPolicy, api.PolicyDirection_POLICY_DIRECTION_EXPORT}} {
		own := &api.Policy{Name: p.name, Statements: []*api.Statement{{
			Name:       p.name + "-local",
			Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
		}}}
		if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: own}); err != nil {
			return fmt.Errorf("bgp: policy %s: %w", p.name, err)
		}
		if err := s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Name: "global", Direction: p.dir, Policies: []*api.Policy{{Name: p.name}},
			DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
		}}); err != nil {
			return fmt.Errorf("bgp: policy %s: %w", p.name, err)
		}
	}
	return nil
}

// prefixLimit is p's prefix limit for family f, as GoBGP takes it.
func prefixLimit(p Peer, f *api.Family) *api.PrefixLimit {
	n := p.MaxPrefixes
	if n == 0 {
		n = DefaultMaxPrefixes
	}
	return &api.PrefixLimit{Family: f, MaxPrefixes: n, ShutdownThresholdPct: prefixLimitWarnPercent}
}

// overPrefixLimit handles a peer event in which GoBGP shut the peer's
// session down for its prefix limit: it says so (the reason a session
// report gives) and tries the session again after PrefixLimitRestart,
// unless the peer is gone or the speaker stopped by then.
func (s *Speaker) overPrefixLimit(peer netip.Addr) string {
	limit := uint32(DefaultMaxPrefixes)
	s.mu.Lock()
	for _, p := range s.cfg.Peers {
		if a, err := netip.ParseAddr(p.Address); err == nil && a.Unmap() == peer && p.MaxPrefixes != 0 {
			limit = p.MaxPrefixes
		}
	}
	s.mu.Unlock()
	s.log.Info("bgp peer sent more routes than its prefix limit; its session is down", "peer", peer,
		"maxPrefixes", limit, "retryIn", PrefixLimitRestart)
	time.AfterFunc(PrefixLimitRestart, func() {
		if !s.configured(peer) {
			return
		}
		s.mu.Lock() // held, so that Stop cannot stop the server meanwhile
		defer s.mu.Unlock()
		if s.stopped {
			return
		}
		if err := s.srv.EnablePeer(context.Background(), &api.EnablePeerRequest{Address: peer.String()}); err != nil {
			s.log.Warn("bgp: cannot try the session again after its prefix limit", "peer", peer, "err", err)
		}
	})
	return fmt.Sprintf("the peer sent more than %d routes of one address family (its prefix limit); tried again in %v", limit, PrefixLimitRestart)
}
