package external

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// bgpProvider announces, from this node, every IP it serves; after an
// update, ips is how many of them have a route out (an aggregate carries
// several) and prefixes how many routes there are.
type bgpProvider struct {
	sp            *bgp.Speaker
	ips, prefixes int
}

func (p *bgpProvider) Name() string { return "bgp" }

func (p *bgpProvider) Update(_ context.Context, s *State) error {
	var routes []bgp.Route
	prefixesOf := map[netip.Addr][]netip.Prefix{}
	ips := s.IPs()
	whole := map[netip.Prefix]bool{}
	for _, ip := range ips {
		if s.Serves(ip) {
			for _, r := range s.ann.bgpRoutes(ip, s.Node) {
				if !r.Prefix.IsSingleIP() && !aggregatable(s, ips, r.Prefix, whole) {
					r.Prefix = bgp.HostRoute(ip).Prefix
				}
				routes = append(routes, r)
				prefixesOf[ip] = append(prefixesOf[ip], r.Prefix)
			}
		}
	}
	err := p.sp.SetRoutes(routes)
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

func (p *bgpProvider) Close(ctx context.Context) error { return p.sp.Stop(ctx) }

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

// l2Provider answers for the IPs this node owns: l2.Owner over the eligible
// nodes whose agents are alive, kept by idx as the cluster changes
// (l2owners.go). When the live nodes of an IP change and this node stays
// its owner, it announces the IP again: a node that starts before it has
// seen the others' Leases may briefly claim an IP and announce it, and
// only the owner's announcement puts clients right.
type l2Provider struct {
	r   l2Answerer
	idx *l2Owners
	// last is the state last told (Update), which a change of liveness
	// alone (followLiveness) is looked at with.
	last *State
	// own is what this node answered for at the last look (nil before
	// the first): an IP it takes over from another node is told to
	// tookOver (an event on its Services).
	own      map[netip.Addr]bool
	tookOver func(ip netip.Addr, from string, svcs []portal.ServiceKey)
	// conflicts keeps one node answering for an IP: a probe before a
	// takeover, a yield or a defence on hearing another (l2conflict.go).
	conflicts l2Conflicts
}

// l2Answerer is what the L2 provider tells which IPs to answer for: the
// responder (*l2.Responder).
type l2Answerer interface {
	Set(ips []netip.Addr)
	Reannounce(ips []netip.Addr)
	Owned() []netip.Addr
	Close()
}

func (p *l2Provider) Name() string { return "l2" }

func (p *l2Provider) Update(_ context.Context, s *State) error {
	p.conflicts.told(s)
	p.last = s
	p.idx.update(s)
	p.settle(s)
	return nil
}

// followLiveness looks again when only the nodes' liveness changed (a
// Lease expired or came back, a node was heard): the cost of a takeover
// is then what moved (l2Owners), not the cluster's size.
func (p *l2Provider) followLiveness() {
	if p.last == nil {
		return
	}
	p.idx.syncLiveness(p.last.Alive)
	p.settle(p.last)
}

// settle tells the responder what this node answers for now that the
// index moved what it moved, probing first for the IPs it takes over
// from a node judged dead.
func (p *l2Provider) settle(s *State) {
	m := p.idx.take()
	var before func(netip.Addr) string
	if p.own != nil {
		before = func(ip netip.Addr) string {
			if was, ok := m.owners[ip]; ok {
				return was
			}
			return p.idx.owner(ip)
		}
	}
	own := p.owned(s)
	took := tookOver(s, before, p.own, own)
	if kept := p.conflicts.probeTakeovers(s, took, own); len(kept) < len(own) {
		// The nodes heard answering a probe are alive now: that is
		// taken at once, as part of this look, so that a node heard
		// again each lease duration does not make this one announce
		// its IPs again, and this node does not take what they answer
		// for.
		p.idx.syncLiveness(s.Alive)
		m.then(p.idx.take())
		keep := map[netip.Addr]bool{}
		for _, ip := range kept {
			keep[ip] = true
		}
		own = slices.DeleteFunc(p.owned(s), func(ip netip.Addr) bool { return took[ip] != "" && !keep[ip] })
		took = tookOver(s, before, p.own, own)
	}
	var again []netip.Addr
	changed := p.idx.changedGroups(m)
	for _, ip := range own {
		if p.own[ip] && (m.regrouped[ip] || changed[p.idx.ips[ip].group]) {
			again = append(again, ip)
		}
	}
	p.r.Set(own)
	p.r.Reannounce(again)
	if p.tookOver != nil {
		for ip, from := range took {
			p.tookOver(ip, from, holders(s, ip))
		}
	}
	p.own = make(map[netip.Addr]bool, len(own))
	for _, ip := range own {
		p.own[ip] = true
	}
}

// owned are the IPs this node owns and serves, sorted.
func (p *l2Provider) owned(s *State) []netip.Addr {
	own := slices.DeleteFunc(p.idx.ownedBy(s.Node), func(ip netip.Addr) bool { return !s.Serves(ip) })
	slices.SortFunc(own, netip.Addr.Compare)
	return own
}

func l2Owner(s *State, ip netip.Addr) (string, []string) {
	var live []string
	for _, n := range s.Eligible(ip) {
		if s.Alive(n) && s.ann.l2Allows(ip, n) {
			live = append(live, n)
		}
	}
	return l2.Owner(ip, live), live
}

func (p *l2Provider) Close(context.Context) error { p.r.Close(); return nil }

// webhookProvider: the leader sends every Service's state; sent is how
// many IPs that state last held (0 while not leading). picks, when set,
// says which addresses the receiver is told about; stop, when set, is
// called as the sender closes. last is the state last set, for a sender
// whose term begins after it (resend).
type webhookProvider struct {
	n     *webhook.Notifier
	sent  int
	picks func(netip.Addr) bool
	stop  func()
	mu    sync.Mutex
	last  []webhook.Payload
}

func (p *webhookProvider) Name() string { return "webhook" }

func (p *webhookProvider) Update(_ context.Context, s *State) error {
	if !s.Leader {
		p.sent = 0
		return nil
	}
	payloads := webhookPayloads(s, p.picks)
	p.mu.Lock()
	p.last = payloads
	p.n.Set(payloads)
	p.mu.Unlock()
	p.sent = payloadIPs(payloads)
	return nil
}

// resend sets the last state again: the first Set of a term that began
// after it sends it as the snapshot.
func (p *webhookProvider) resend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last != nil {
		p.n.Set(p.last)
	}
}

// Close ends the sender's term: what it has pending is dropped.
func (p *webhookProvider) Close(context.Context) error {
	p.n.Demote()
	if p.stop != nil {
		p.stop()
	}
	p.n.Wait()
	return nil
}

// webhookPayloads groups targets by Service, of the addresses picks picks
// (nil: all).
func webhookPayloads(s *State, picks func(netip.Addr) bool) []webhook.Payload {
	by := map[string]*webhook.Payload{}
	var order []string
	for _, t := range s.Targets {
		if picks != nil && !picks(t.IP) {
			continue
		}
		name := t.Service.String()
		if t.Pod {
			name = "pod/" + name
		}
		pl := by[name]
		if pl == nil {
			pl = &webhook.Payload{Service: name, IPs: []string{}, Ports: []webhook.Port{}, Nodes: []webhook.Node{}, HealthCheckNodePort: t.HealthCheckNodePort}
			for _, port := range t.Ports {
				pl.Ports = append(pl.Ports, webhook.Port{Port: port.Port, Protocol: strings.ToUpper(port.Protocol.String())})
			}
			for _, n := range t.Nodes {
				node := webhook.Node{Name: n, Addresses: []string{}}
				for _, a := range s.NodeAddresses[n] {
					node.Addresses = append(node.Addresses, a.String())
				}
				pl.Nodes = append(pl.Nodes, node)
			}
			by[name] = pl
			order = append(order, name)
		}
		pl.IPs = append(pl.IPs, t.IP.String())
	}
	slices.Sort(order)
	out := make([]webhook.Payload, 0, len(order))
	for _, n := range order {
		out = append(out, *by[n])
	}
	return out
}

// providerStart starts one provider of this process's role; a start that
// fails is tried again with back-off (startDue) until it succeeds.
type providerStart struct {
	name  string
	start func(ctx context.Context) (Provider, error)
}

// planProviders lists what the hook's role runs: BGP and L2 (with this
// node's liveness Lease) on a node, the webhook sender where the
// cluster-wide part runs; the caller's own, already running, everywhere.
func (h *Hook) planProviders() {
	if h.role.node() {
		if h.conf().BGP != nil {
			h.starts = append(h.starts, providerStart{"bgp", h.startBGP})
		}
		if h.conf().L2 != nil {
			h.starts = append(h.starts, providerStart{"l2", h.startL2})
		}
	}
	if h.conf().Webhook != nil && h.role.controller() {
		h.starts = append(h.starts, providerStart{"webhook", h.startWebhook})
	}
	for _, s := range h.starts {
		h.phealth.pending(s.name)
	}
	for _, p := range h.extra {
		h.phealth.ok(p.Name())
	}
	h.providers = append(h.providers, h.extra...)
}

// startDue tries the starts that are due at now; a provider that starts
// joins h.providers. It returns when the earliest of those still failing
// is due again (zero when none is left).
func (h *Hook) startDue(ctx context.Context, now time.Time) (next time.Time) {
	left := h.starts[:0]
	for _, s := range h.starts {
		if !h.phealth.due(s.name, now) {
			next = earliest(next, h.phealth.status(s.name).next)
			left = append(left, s)
			continue
		}
		p, err := s.start(ctx)
		if err != nil {
			next = earliest(next, h.phealth.failed(s.name, stageStart, err, now))
			left = append(left, s)
			continue
		}
		h.phealth.ok(s.name)
		h.providers = append(h.providers, p)
	}
	h.starts = left
	return next
}

// earliest is the earlier of a and b, a zero time counting as none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

func (h *Hook) startWebhook(ctx context.Context) (Provider, error) {
	n, err := webhook.New(*h.conf().Webhook, h.log.With("provider", "webhook"), h.webhookFailed, h.webhookDelivered)
	h.mu.Lock()
	h.webhookErr = err // a process without its sender does not lead (leadBlocker)
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	n.Start(ctx)
	for _, o := range []string{dataplane.WebhookSuccess, dataplane.WebhookRejected, dataplane.WebhookUnreachable} {
		h.phealth.metrics.WebhookRequests(o, 0) // the series exist from the start
	}
	p := &webhookProvider{n: n, picks: func(ip netip.Addr) bool { return h.conf().webhookPicks(ip) }}
	p.stop = func() {
		h.mu.Lock()
		if h.notifier == n {
			h.notifier = nil
		}
		h.mu.Unlock()
	}
	// Started while this process leads (its first start failed, or its
	// configuration changed): it leads from now, in a term of its own
	// (leading covers the other order), and sends the state it was told
	// meanwhile.
	h.mu.Lock()
	h.notifier = n
	lctx := h.leadCtx
	h.mu.Unlock()
	if lctx != nil {
		go func() {
			if err := h.leadWebhook(lctx, n); err != nil {
				if lctx.Err() == nil {
					h.endCampaign(cannotLead{err})
				}
				return
			}
			p.resend()
		}()
	}
	return p, nil
}

// startBGP starts this node's BGP speaker.
func (h *Hook) startBGP(ctx context.Context) (Provider, error) {
	var internal []netip.Addr
	if obj, ok, _ := h.nodes.GetStore().GetByKey(h.node); ok {
		for _, a := range obj.(*corev1.Node).Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
				internal = append(internal, ip)
			}
		}
	}
	cfg := h.conf()
	if cfg.bgpErr != nil {
		return nil, cfg.bgpErr
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
	return &bgpProvider{sp: sp}, nil
}

// startL2 starts this node's ARP/NDP responder; its liveness Lease is
// renewed only once it answers (Run starts it), so that no other node
// counts on this one for an IP it cannot announce.
func (h *Hook) startL2(ctx context.Context) (Provider, error) {
	cfg := h.conf()
	c := cfg.L2
	ifaces, err := withPatterns(c.Interfaces, cfg.l2Patterns)
	if err != nil {
		return nil, err
	}
	if len(ifaces) == 0 && len(cfg.l2Patterns) == 0 {
		name, err := interfaceOf(h.nodeAddrs(h.node))
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
		h.liveness = newLiveness(h.client, cfg.LeaseNamespace, h.node, sec(c.LeaseRenewSeconds), sec(c.LeaseDurationSeconds), h.log, h.livePoke)
		// Back from an outage or a partition: the others may have taken
		// this node's IPs meanwhile; announcing them again moves clients back.
		h.liveness.resumed = func() {
			h.mu.Lock()
			r := h.l2r
			h.mu.Unlock()
			if r != nil {
				r.Reannounce(r.Owned())
			}
		}
		h.liveness.linkAddrs = h.l2LinkAddrs
	}
	p := &l2Provider{r: r, idx: newL2Owners(), tookOver: h.l2TookOver, conflicts: l2Conflicts{announce: r.Reannounce, probe: r.Probe, lv: h.liveness, poke: h.poke, log: h.log,
		stopping: func() bool { return ctx.Err() != nil }}}
	r.OnConflict(p.conflicts.heard)
	return p, nil
}

// webhookDelivered counts a request the receiver took.
func (h *Hook) webhookDelivered(string) {
	h.phealth.metrics.WebhookRequests(dataplane.WebhookSuccess, 1)
}

// webhookFailed counts a failed request and puts an event on the Service
// (first and every 5th attempt).
func (h *Hook) webhookFailed(service string, err error, attempt int) {
	h.phealth.metrics.WebhookRequests(webhookOutcome(err), 1)
	if attempt != 1 && attempt%5 != 0 {
		return
	}
	obj, ok, _ := h.services.GetStore().GetByKey(service) // "namespace/name", as the store keys
	if !ok {
		return
	}
	h.leaderRec.Eventf(obj.(*corev1.Service), corev1.EventTypeWarning, "WebhookFailed", "attempt %d: %v", attempt, err)
}
