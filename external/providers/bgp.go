package providers

import (
	"context"
	"errors"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/external/bgp"
)

// BGP announces, from this node, every IP it serves, through its speaker;
// after an update, ips is how many of them have a route out (an aggregate
// carries several) and prefixes how many routes there are.
type BGP struct {
	sp            *bgp.Speaker
	ips, prefixes int
}

// NewBGP is the provider of the running speaker sp.
func NewBGP(sp *bgp.Speaker) *BGP { return &BGP{sp: sp} }

// SetPeers changes the speaker's peers alone (bgp.Speaker.SetPeers).
func (p *BGP) SetPeers(ctx context.Context, peers []bgp.Peer) error { return p.sp.SetPeers(ctx, peers) }

// Announced is how many IPs have a route out after the last update.
func (p *BGP) Announced() int { return p.ips }

// Prefixes is how many routes the speaker announces, aggregates included.
func (p *BGP) Prefixes() int { return p.prefixes }

// Name is "bgp".
func (p *BGP) Name() string { return "bgp" }

// Update announces the routes of the IPs this node serves.
func (p *BGP) Update(ctx context.Context, s *State) error {
	var routes []bgp.Route
	prefixesOf := map[netip.Addr][]netip.Prefix{}
	ips := s.IPs()
	whole := map[netip.Prefix]bool{}
	for _, ip := range ips {
		if s.Serves(ip) {
			for _, r := range s.view.Ann.BGPRoutes(ip, s.Node) {
				if !r.Prefix.IsSingleIP() && !aggregatable(s, ips, r.Prefix, whole) {
					r.Prefix = bgp.HostRoute(ip).Prefix
				}
				routes = append(routes, r)
				prefixesOf[ip] = append(prefixesOf[ip], r.Prefix)
			}
		}
	}
	err := p.sp.SetRoutes(routes)
	if s.DataplaneReported() {
		err = errors.Join(err, p.sp.Ready(ctx))
	}
	announced := p.sp.Announced()
	p.prefixes = len(announced)
	out := make(map[netip.Prefix]bool, len(announced))
	for _, pfx := range announced {
		out[pfx] = true
	}
	p.ips = 0
	for _, pfxs := range prefixesOf {
		if slices.ContainsFunc(pfxs, func(pfx netip.Prefix) bool { return out[pfx] }) {
			p.ips++
		}
	}
	return err
}

// Close withdraws them all and stops the speaker.
func (p *BGP) Close(ctx context.Context) error { return p.sp.Stop(ctx) }

// CloseForRestart stops the speaker as the agent stops: the routes of the
// peers with graceful restart are left to their routers for the restart
// time (bgp.Speaker.StopForRestart); without any, it is Close.
func (p *BGP) CloseForRestart(ctx context.Context) error { return p.sp.StopForRestart(ctx) }

// aggregatable reports whether this node may announce prefix, an
// aggregate: every address of ips inside it that some node should receive
// should be received by the same nodes, and this node serves each of them.
// Otherwise the aggregate would draw the traffic of an address served
// elsewhere alone (an externalTrafficPolicy Local Service whose endpoints
// are on other nodes, a Pod's address) and black-hole it, or leave the
// addresses the nodes share to the one node announcing them alone; every
// node then announces its own addresses alone, and the router's longest
// match sends each where it is served. Answers are kept in memo, per
// prefix, for one update: the cost is the addresses inside each aggregate
// once, whatever the number of Services sharing it.
func aggregatable(s *State, ips []netip.Addr, prefix netip.Prefix, memo map[netip.Prefix]bool) bool {
	if ok, seen := memo[prefix]; seen {
		return ok
	}
	ok := true
	var nodes []string
	i, _ := slices.BinarySearchFunc(ips, prefix.Masked().Addr(), netip.Addr.Compare)
	for ; ok && i < len(ips) && prefix.Contains(ips[i]); i++ {
		e := s.Eligible(ips[i])
		switch {
		case len(e) == 0:
		case nodes == nil:
			nodes = e
			ok = s.Serves(ips[i])
		default:
			ok = slices.Equal(nodes, e) && s.Serves(ips[i])
		}
	}
	memo[prefix] = ok
	return ok
}
