package external

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/providers"
	"github.com/onehop/onehop/portal"
)

// The per-node part: the providers that announce from this node (BGP, L2),
// this node's liveness Lease and the L2 heartbeats, and what is known of
// this node and the others.

// The hook's metrics (dataplane's hookMetrics, on the registry
// WithProviderHealth gives): what each provider announces, each BGP
// session's state (bgpSession), the pools' addresses on the holder of the
// allocator Lease (observePools), and the webhook sender's requests. The
// L2 heartbeats' are the hook's own (leases.RegisterHeartbeatMetrics, on
// WithRegisterer's registry).

// announcing is a provider that can say how many IPs it announces now.
type announcing interface{ Announced() int }

// observeAnnounced sets onehop_announced_ips of p after an update, taken
// or not.
func (h *Hook) observeAnnounced(p providers.Provider) {
	a, ok := p.(announcing)
	if !ok {
		return
	}
	n := a.Announced()
	h.metrics.Announced(p.Name(), n)
	if b, ok := p.(*providers.BGP); ok {
		h.bgpPeers.SetAnnounced(h.metrics, b.Prefixes()) // aggregates included
	}
}

// registerMetrics registers the hook's own collectors on h.registerer.
func (h *Hook) registerMetrics() {
	if h.registerer == nil {
		return
	}
	leases.RegisterHeartbeatMetrics(h.registerer, func() *heartbeat.Heartbeat {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.beats
	}, h.log)
}

// startBGP starts this node's BGP speaker.
func (h *Hook) startBGP(ctx context.Context) (providers.Provider, error) {
	var internal []netip.Addr
	if obj, ok, _ := h.nodes.GetStore().GetByKey(h.node); ok {
		for _, a := range obj.(*corev1.Node).Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
				internal = append(internal, ip)
			}
		}
	}
	cfg := h.conf()
	if err := cfg.BGPError(); err != nil {
		return nil, err
	}
	sp, err := bgp.NewSpeaker(*cfg.BGP, internal, h.log.With("provider", "bgp"))
	if err != nil {
		return nil, err
	}
	sp.OnSession(h.bgpSession)
	if err := sp.Start(ctx); err != nil {
		_ = sp.Stop(ctx)
		return nil, err
	}
	return providers.NewBGP(sp), nil
}

// startL2 starts this node's ARP/NDP responder; its liveness Lease is
// renewed only once it answers (Run starts it), so that no other node
// counts on this one for an IP it cannot announce.
func (h *Hook) startL2(ctx context.Context) (providers.Provider, error) {
	cfg := h.conf()
	c := cfg.L2
	ifaces, err := l2.WithPatterns(c.Interfaces, cfg.L2Patterns())
	if err != nil {
		return nil, err
	}
	if len(ifaces) == 0 && len(cfg.L2Patterns()) == 0 {
		name, err := l2.InterfaceOf(h.nodeAddrs(h.node))
		if err != nil {
			return nil, err
		}
		ifaces = []string{name}
	}
	r, err := l2.NewResponder(ifaces, h.log.With("provider", "l2"))
	if err != nil {
		return nil, err
	}
	r.SetPeriodic(c.Periodic())
	h.mu.Lock()
	h.l2r = r
	h.mu.Unlock()
	// One liveness tracker for the life of the hook: a responder started
	// again (reload) keeps it, and its Lease.
	if h.liveness == nil {
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		h.liveness = leases.NewLiveness(h.client, cfg.LeaseNamespace, h.node, sec(c.LeaseRenewSeconds), sec(c.LeaseDurationSeconds), h.log, h.livePoke)
		// Back from an outage or a partition: the others may have taken
		// this node's IPs meanwhile; announcing them again moves clients back.
		h.liveness.OnResumed(func() {
			h.mu.Lock()
			r := h.l2r
			h.mu.Unlock()
			if r != nil {
				r.Reannounce(r.Owned())
			}
		})
		h.liveness.PublishLinkAddrs(h.l2LinkAddrs)
	}
	p := providers.NewL2(r, providers.L2Options{Liveness: h.liveness, Probe: r.Probe, TookOver: h.l2TookOver, Poke: h.poke, Log: h.log,
		Stopping: func() bool { return ctx.Err() != nil }})
	r.OnConflict(p.Heard)
	return p, nil
}

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
	h.bgpPeers.Session(h.metrics, s)
	if s.Up == s.WasUp {
		return // first seen down, or gone while down: nothing came or went
	}
	if s.Up {
		h.log.Info("bgp session established", "peer", s.Peer, "asn", s.ASN)
		h.phealth.Event(corev1.EventTypeNormal, reasonBGPSessionUp, "BGP session with %s (AS %d) established", s.Peer, s.ASN)
		return
	}
	why := ""
	if s.Reason != "" {
		why = ": " + s.Reason
	}
	h.log.Warn("bgp session down", "peer", s.Peer, "asn", s.ASN, "reason", s.Reason)
	h.phealth.Event(corev1.EventTypeWarning, reasonBGPSessionDown, "BGP session with %s (AS %d) is down%s", s.Peer, s.ASN, why)
}

// l2TookOver puts an IPMoved event on each Service holding ip (svcs),
// which this node answers for now in place of node from.
func (h *Hook) l2TookOver(ip netip.Addr, from string, svcs []portal.ServiceKey) {
	h.log.Info("l2: took over an IP", "ip", ip, "from", from)
	h.moved(h.rec, svcs, corev1.EventTypeNormal, "%s moved to node %s (l2: it answers ARP/NDP for it now), from node %s", ip, h.node, from)
}

// l2LinkAddrs are the link-layer addresses the running L2 responder
// answers with, for this node's liveness Lease.
func (h *Hook) l2LinkAddrs() []string {
	h.mu.Lock()
	r := h.l2r
	h.mu.Unlock()
	if r == nil {
		return nil
	}
	var out []string
	for _, a := range r.LinkAddrs() {
		out = append(out, a.String())
	}
	return out
}

// startLiveness feeds the liveness tracker every liveness Lease and
// renews this node's own until ctx ends (goroutines of wg), and starts the
// heartbeats with it. The returned stop shuts the Lease informer down.
func (h *Hook) startLiveness(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	stop, err = h.liveness.Watch(ctx)
	if err != nil {
		return nil, err
	}
	h.startHeartbeat(ctx, wg)
	wg.Go(func() { h.liveness.Run(ctx) })
	return stop, nil
}

// linkState is whether this node's L2 links are up, as last looked at.
type linkState struct{ down atomic.Bool }

func (s *linkState) up() bool { return !s.down.Load() }

// internalIP is node's first InternalIP of the family of like (any family
// when like is not valid).
func (h *Hook) internalIP(node string, like netip.Addr) netip.Addr {
	obj, ok, _ := h.nodes.GetStore().GetByKey(node)
	if !ok {
		return netip.Addr{}
	}
	for _, a := range obj.(*corev1.Node).Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && (!like.IsValid() || ip.Unmap().Is4() == like.Is4()) {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// startHeartbeat follows this node's L2 links and, with a key, starts the
// heartbeats (goroutines of wg, until ctx ends). A heartbeat that cannot
// start is logged, and the Leases alone judge the nodes.
func (h *Hook) startHeartbeat(ctx context.Context, wg *sync.WaitGroup) {
	links := &linkState{}
	h.liveness.SetLinkUp(links.up)
	c := h.conf().L2
	var hc l2.HeartbeatConfig
	if c != nil && c.Heartbeat != nil {
		hc = *c.Heartbeat
	}
	interval := heartbeat.DefaultInterval
	if hc.IntervalMillis > 0 {
		interval = time.Duration(hc.IntervalMillis) * time.Millisecond
	}
	wg.Go(func() { h.watchLinks(ctx, links, interval) })
	keys, why := leases.ReadHeartbeatKeys(&hc)
	if keys == nil {
		h.log.Info("l2 heartbeats off: nodes are judged by their Leases alone", "why", why)
		return
	}
	self := h.internalIP(h.node, netip.Addr{})
	if !self.IsValid() {
		h.log.Warn("l2 heartbeats off: this node has no InternalIP to send them from; nodes are judged by their Leases alone", "node", h.node)
		return
	}
	port := hc.Port
	if port == 0 {
		port = heartbeat.DefaultPort
	}
	hb, err := heartbeat.Listen(heartbeat.Config{Node: h.node, Incarnation: uint64(time.Now().UnixNano()), Key: keys[0], Accept: keys[1:],
		Bind: netip.AddrPortFrom(self, uint16(port)), Interval: interval, Missed: hc.Missed, RestartHold: hc.RestartHold()}, h.log, h.livePoke)
	if err != nil {
		h.log.Warn("l2 heartbeats off: nodes are judged by their Leases alone", "err", err)
		return
	}
	hb.SetUp(links.up)
	// A clean stop: this node stops answering before it tells the others
	// it leaves. They take its IPs over at once, without a probe; were it
	// still answering, a reply of its own to their announcement would
	// make it alive again to them, and they would yield to it.
	hb.SetBeforeLeave(func() {
		h.mu.Lock()
		r := h.l2r
		h.mu.Unlock()
		if r != nil {
			r.Close()
		}
	})
	restarts := func() bool { return h.restartsOnStop(hc.RestartHold()) }
	hb.SetRestarting(restarts)
	h.mu.Lock()
	h.beats = hb
	h.mu.Unlock()
	h.liveness.SetHeartbeats(hb, restarts)
	h.syncHeartbeatPeers()
	h.log.Info("l2 heartbeats on", "bind", netip.AddrPortFrom(self, uint16(port)), "interval", interval, "timeout", hb.Timeout())
	wg.Go(func() { hb.Run(ctx) })
}

// restartsOnStop says whether this agent, stopping, restarts rather than
// leaves: the restart hold is on and its Node stays (not cordoned, not
// being deleted). A drain cordons the node first, so that its agent hands
// its IPs over at once; a node shut down without one stops answering the
// others' echo requests, and is dead to them then.
func (h *Hook) restartsOnStop(hold time.Duration) bool {
	if hold <= 0 {
		return false
	}
	obj, ok, _ := h.nodes.GetStore().GetByKey(h.node)
	if !ok {
		return false
	}
	n := obj.(*corev1.Node)
	return !n.Spec.Unschedulable && n.DeletionTimestamp == nil
}

// syncHeartbeatPeers makes the nodes with a liveness Lease, at their
// InternalIPs, the heartbeats' peers.
func (h *Hook) syncHeartbeatPeers() {
	h.mu.Lock()
	hb := h.beats
	h.mu.Unlock()
	if hb == nil {
		return
	}
	self := h.internalIP(h.node, netip.Addr{})
	peers := map[string]netip.Addr{}
	for _, n := range h.liveness.Members() {
		if ip := h.internalIP(n, self); ip.IsValid() && n != h.node {
			peers[n] = ip
		}
	}
	hb.SetPeers(peers)
}

// watchLinks looks at this node's L2 links every interval until ctx ends;
// when they all go down, or one comes up again, liveness changed.
func (h *Hook) watchLinks(ctx context.Context, s *linkState, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		r := h.l2r
		h.mu.Unlock()
		if r == nil {
			continue
		}
		down := !r.Up()
		if s.down.Swap(down) == down {
			continue
		}
		if down {
			h.log.Warn("l2: every interface this node answers on is down; it gives its IPs up, stops its heartbeats and its Lease")
		} else {
			h.log.Info("l2: an interface this node answers on is up again; it takes its IPs back")
		}
		h.livePoke()
	}
}

// ownNode is this node's Node object, nil when not known.
func (h *Hook) ownNode() *corev1.Node {
	o, ok, _ := h.nodes.GetStore().GetByKey(h.node)
	if !ok {
		return nil
	}
	return o.(*corev1.Node)
}

// nodeLabels are node name's labels (nil when not known).
func (h *Hook) nodeLabels(name string) labels.Set {
	o, ok, _ := h.nodes.GetStore().GetByKey(name)
	if !ok {
		return nil
	}
	return o.(*corev1.Node).Labels
}

func (h *Hook) nodeAddrs(name string) []netip.Addr {
	obj, ok, _ := h.nodes.GetStore().GetByKey(name)
	if !ok {
		return nil
	}
	var out []netip.Addr
	for _, a := range obj.(*corev1.Node).Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
