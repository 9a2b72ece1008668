package bgp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Speaker is one node's BGP speaker.
type Speaker struct {
	cfg      Config
	nextHops map[bool]netip.Addr // is IPv6 -> next hop
	log      *slog.Logger
	srv      *server.BgpServer
	// gobgpLevel is the level of GoBGP's own log (StopForRestart).
	gobgpLevel *slog.LevelVar

	mu        sync.Mutex
	announced map[netip.Prefix]announcedRoute
	stopped   bool
	// held are the peers with graceful restart not given to GoBGP yet:
	// they wait for Ready, which sets ready.
	held  map[netip.Addr]Peer
	ready bool

	// sessions reports the sessions' changes (OnSession); endWatch ends
	// the watch of GoBGP's peer events that feeds it (Stop).
	sessions sessions
	endWatch context.CancelFunc
}

// NewSpeaker builds a speaker; nodeAddrs supply the default next hops (the
// first address of each family).
func NewSpeaker(cfg Config, nodeAddrs []netip.Addr, log *slog.Logger) (*Speaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Speaker{cfg: cfg, nextHops: map[bool]netip.Addr{}, log: log, announced: map[netip.Prefix]announcedRoute{}}
	for _, a := range nodeAddrs {
		a = a.Unmap()
		if _, ok := s.nextHops[a.Is6()]; !ok && a.IsValid() {
			s.nextHops[a.Is6()] = a
		}
	}
	if cfg.NextHopIPv4 != "" {
		s.nextHops[false] = netip.MustParseAddr(cfg.NextHopIPv4)
	}
	if cfg.NextHopIPv6 != "" {
		s.nextHops[true] = netip.MustParseAddr(cfg.NextHopIPv6)
	}
	if len(s.nextHops) == 0 {
		return nil, fmt.Errorf("bgp: no next-hop address (node has no InternalIP and none is configured)")
	}
	return s, nil
}

// Start starts the speaker and adds the peers.
func (s *Speaker) Start(ctx context.Context) error {
	s.gobgpLevel = &slog.LevelVar{}
	s.gobgpLevel.Set(slog.LevelWarn)
	s.srv = server.NewBgpServer(server.LoggerOption(s.log.With("component", "gobgp"), s.gobgpLevel))
	go s.srv.Serve()
	rid := s.cfg.RouterID
	if rid == "" {
		if a, ok := s.nextHops[false]; ok {
			rid = a.String()
		} else {
			return fmt.Errorf("bgp: routerID is required on an IPv6-only node")
		}
	}
	port := s.cfg.ListenPort
	if port == 0 {
		port = -1
	}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: s.cfg.ASN, RouterId: rid, ListenPort: port}}); err != nil {
		return fmt.Errorf("bgp: start: %w", err)
	}
	if err := s.setPolicy(ctx); err != nil {
		_ = s.srv.StopBgp(ctx, &api.StopBgpRequest{})
		return err
	}
	// The watch lives as long as the speaker (Stop ends it), not as ctx.
	wctx, end := context.WithCancel(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.endWatch = end
	s.mu.Unlock()
	if err := s.watch(wctx, s.srv); err != nil {
		s.log.Warn("bgp: cannot watch peer events; session changes are not reported", "err", err)
	}
	for _, p := range s.cfg.Peers {
		if s.hold(p) {
			continue
		}
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peer(p)}); err != nil {
			_ = s.srv.StopBgp(ctx, &api.StopBgpRequest{})
			return fmt.Errorf("bgp: peer %s: %w", p.Address, err)
		}
	}
	return nil
}

func (s *Speaker) peer(p Peer) *api.Peer {
	hold := p.HoldTimeSeconds
	if hold == 0 {
		hold = 90
	}
	pc := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address, PeerAsn: p.ASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry: 1, HoldTime: hold, KeepaliveInterval: max(hold/3, 1),
			IdleHoldTimeAfterReset: 1, // GoBGP's default (30 s) would keep a BFD-reset session down
		}},
		Transport: &api.Transport{RemotePort: uint32(p.Port)},
	}
	for _, f := range s.families() {
		pc.AfiSafis = append(pc.AfiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true},
			PrefixLimits: prefixLimit(p, f)})
	}
	if p.Multihop > 0 {
		pc.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.Multihop)}
	}
	if p.BFD {
		iv := p.BFDIntervalMillis
		if iv == 0 {
			iv = 300
		}
		pc.Bfd = &api.BfdPeerConfig{Enabled: true, Port: 3784,
			DesiredMinimumTxInterval: iv * 1000, RequiredMinimumReceive: iv * 1000, DetectionMultiplier: 3}
	}
	gracefulRestart(pc, p)
	return pc
}

// families are the address families the speaker announces: those it has
// a next hop of, IPv4 first.
func (s *Speaker) families() []*api.Family {
	var out []*api.Family
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		if _, ok := s.nextHops[afi == api.Family_AFI_IP6]; ok {
			out = append(out, &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST})
		}
	}
	return out
}

// announcedRoute is a route as the speaker gave it to GoBGP.
type announcedRoute struct {
	route Route
	path  *apiutil.Path
}

func (s *Speaker) path(r Route) (*apiutil.Path, error) {
	ip := r.Prefix.Addr()
	nh, ok := s.nextHops[ip.Is6()]
	if !ok {
		return nil, fmt.Errorf("no %s next hop for %s", map[bool]string{false: "IPv4", true: "IPv6"}[ip.Is6()], r.Prefix)
	}
	nlri, err := bgp.NewIPAddrPrefix(r.Prefix.Masked())
	if err != nil {
		return nil, err
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if ip.Is4() {
		a, err := bgp.NewPathAttributeNextHop(nh)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, a)
	} else {
		family = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, nh)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, mp)
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: append(attrs, r.attrs()...)}, nil
}

// Set announces exactly the host routes of ips (see SetRoutes).
func (s *Speaker) Set(ips []netip.Addr) error {
	routes := make([]Route, 0, len(ips))
	for _, ip := range ips {
		routes = append(routes, HostRoute(ip))
	}
	return s.SetRoutes(routes)
}

// SetRoutes announces exactly routes: new ones are announced, missing
// ones withdrawn, and one whose attributes changed is announced again
// with the new ones (an implicit withdrawal: peers replace it). Routes of
// the same prefix are merged (Route.Merge). Withdrawals go first.
func (s *Speaker) SetRoutes(routes []Route) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.srv == nil {
		return errors.New("bgp: speaker not running")
	}
	want := map[netip.Prefix]Route{}
	for _, r := range routes {
		r.Prefix = netip.PrefixFrom(r.Prefix.Addr().Unmap(), r.Prefix.Bits()).Masked()
		if w, ok := want[r.Prefix]; ok {
			w.Merge(r)
			r = w
		} else {
			r.Communities = slices.Clone(r.Communities)
			r.LargeCommunities = slices.Clone(r.LargeCommunities)
		}
		want[r.Prefix] = r
	}
	var errs []error
	for pfx, a := range s.announced {
		if _, ok := want[pfx]; !ok {
			if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{a.path}}); err != nil {
				errs = append(errs, fmt.Errorf("withdraw %s: %w", pfx, err))
				continue
			}
			delete(s.announced, pfx)
			s.log.Info("bgp withdraw", "prefix", pfx)
		}
	}
	for pfx, r := range want {
		if a, ok := s.announced[pfx]; ok && a.route.Equal(r) {
			continue
		}
		p, err := s.path(r)
		if err == nil {
			_, err = s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("announce %s: %w", r, err))
			continue
		}
		s.announced[pfx] = announcedRoute{route: r, path: p}
		s.log.Info("bgp announce", "route", r.String(), "nextHop", s.nextHops[pfx.Addr().Is6()])
	}
	return errors.Join(errs...)
}

// Announced returns the prefixes the speaker announces now, sorted.
func (s *Speaker) Announced() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.Prefix, 0, len(s.announced))
	for pfx := range s.announced {
		out = append(out, pfx)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return out
}

// Stop withdraws every route, gives the UPDATEs a moment to leave, then
// closes the sessions: each peer is reported gone (OnSession), and the
// watch of the sessions ends.
func (s *Speaker) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || s.srv == nil {
		s.mu.Unlock()
		return nil
	}
	n := len(s.announced)
	s.mu.Unlock()
	err := s.Set(nil)
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	if n > 0 {
		select { // withdrawals are sent asynchronously by the peers' FSMs
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	s.sessions.close()
	// Not StopBgp alone: that leaves the server's BFD loop running, one
	// goroutine for every speaker a reload replaced. Stop logs its errors.
	s.srv.Stop()
	s.mu.Lock()
	end := s.endWatch
	s.mu.Unlock()
	if end != nil {
		end()
	}
	return err
}
