package external

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
)

// bgpProvider announces, from this node, every IP it serves.
type bgpProvider struct{ sp *bgp.Speaker }

func (p *bgpProvider) Name() string { return "bgp" }

func (p *bgpProvider) Update(_ context.Context, s *State) error {
	var ips []netip.Addr
	for _, ip := range s.IPs() {
		if s.Serves(ip) {
			ips = append(ips, ip)
		}
	}
	return p.sp.Set(ips)
}

func (p *bgpProvider) Close(ctx context.Context) error { return p.sp.Stop(ctx) }

// l2Provider answers for the IPs this node owns: l2.Owner over the eligible
// nodes whose agents are alive. When the live nodes of an IP change and
// this node stays its owner, it announces the IP again: a node that starts
// before it has seen the others' Leases may briefly claim an IP and
// announce it, and only the owner's announcement puts clients right.
type l2Provider struct {
	r    *l2.Responder
	live map[netip.Addr]string // the live candidates of each owned IP, last seen
}

func (p *l2Provider) Name() string { return "l2" }

func (p *l2Provider) Update(_ context.Context, s *State) error {
	var own, again []netip.Addr
	live := map[netip.Addr]string{}
	for _, ip := range s.IPs() {
		owner, candidates := l2Owner(s, ip)
		if owner == s.Node && s.Serves(ip) {
			own = append(own, ip)
			live[ip] = strings.Join(candidates, ",")
			if prev, ok := p.live[ip]; ok && prev != live[ip] {
				again = append(again, ip)
			}
		}
	}
	p.r.Set(own)
	p.r.Reannounce(again)
	p.live = live
	return nil
}

func l2Owner(s *State, ip netip.Addr) (string, []string) {
	var live []string
	for _, n := range s.Eligible(ip) {
		if s.Alive(n) {
			live = append(live, n)
		}
	}
	return l2.Owner(ip, live), live
}

func (p *l2Provider) Close(context.Context) error { p.r.Close(); return nil }

// webhookProvider: the leader sends every Service's state.
type webhookProvider struct{ n *webhook.Notifier }

func (p *webhookProvider) Name() string { return "webhook" }

func (p *webhookProvider) Update(_ context.Context, s *State) error {
	if !s.Leader {
		return nil
	}
	p.n.Set(webhookPayloads(s))
	return nil
}

func (p *webhookProvider) Close(context.Context) error { return nil }

// webhookPayloads groups targets by Service.
func webhookPayloads(s *State) []webhook.Payload {
	by := map[string]*webhook.Payload{}
	var order []string
	for _, t := range s.Targets {
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
		if h.cfg.BGP != nil {
			h.starts = append(h.starts, providerStart{"bgp", h.startBGP})
		}
		if h.cfg.L2 != nil {
			h.starts = append(h.starts, providerStart{"l2", h.startL2})
		}
	}
	if h.cfg.Webhook != nil && h.role.controller() {
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

func (h *Hook) startWebhook(context.Context) (Provider, error) {
	n, err := webhook.New(*h.cfg.Webhook, h.log.With("provider", "webhook"), h.webhookFailed, nil)
	if err != nil {
		return nil, err
	}
	// Started while this process leads (its first start failed): it
	// leads from now, in this term (leading covers the other order).
	h.mu.Lock()
	h.notifier = n
	lctx := h.leadCtx
	h.mu.Unlock()
	if lctx != nil {
		go h.leadWebhook(lctx, n)
	}
	return &webhookProvider{n: n}, nil
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
	sp, err := bgp.NewSpeaker(*h.cfg.BGP, internal, h.log.With("provider", "bgp"))
	if err != nil {
		return nil, err
	}
	if err := sp.Start(ctx); err != nil {
		_ = sp.Stop(ctx)
		return nil, err
	}
	return &bgpProvider{sp: sp}, nil
}

// startL2 starts this node's ARP/NDP responder; its liveness Lease is
// renewed only once it answers (Run starts it), so that no other node
// counts on this one for an IP it cannot announce.
func (h *Hook) startL2(context.Context) (Provider, error) {
	c := h.cfg.L2
	ifaces := c.Interfaces
	if len(ifaces) == 0 {
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
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	h.liveness = newLiveness(h.client, h.cfg.LeaseNamespace, h.node, sec(c.LeaseRenewSeconds), sec(c.LeaseDurationSeconds), h.log, h.poke)
	// Back from an outage or a partition: the others may have taken
	// this node's IPs meanwhile; announcing them again moves clients back.
	h.liveness.resumed = func() { r.Reannounce(r.Owned()) }
	return &l2Provider{r: r}, nil
}

// webhookFailed puts an event on the Service (first and every 5th attempt).
func (h *Hook) webhookFailed(service string, err error, attempt int) {
	if attempt != 1 && attempt%5 != 0 {
		return
	}
	obj, ok, _ := h.services.GetStore().GetByKey(service) // "namespace/name", as the store keys
	if !ok {
		return
	}
	h.rec.Eventf(obj.(*corev1.Service), corev1.EventTypeWarning, "WebhookFailed", "attempt %d: %v", attempt, err)
}
