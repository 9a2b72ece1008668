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

// startProviders starts what the hook's role runs: BGP and L2 (with this
// node's liveness Lease) on a node, the webhook sender where the
// cluster-wide part runs, the caller's own everywhere.
func (h *Hook) startProviders(ctx context.Context) error {
	if h.role.node() {
		if err := h.startNodeProviders(ctx); err != nil {
			return err
		}
	}
	if c := h.cfg.Webhook; c != nil && h.role.controller() {
		n, err := webhook.New(*c, h.log.With("provider", "webhook"), h.webhookFailed, nil)
		if err != nil {
			return err
		}
		h.notifier = n
		h.providers = append(h.providers, &webhookProvider{n: n})
	}
	h.providers = append(h.providers, h.extra...)
	return nil
}

// startNodeProviders starts the providers that announce from this node.
func (h *Hook) startNodeProviders(ctx context.Context) error {
	if c := h.cfg.BGP; c != nil {
		var internal []netip.Addr
		if obj, ok, _ := h.nodes.GetStore().GetByKey(h.node); ok {
			for _, a := range obj.(*corev1.Node).Status.Addresses {
				if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
					internal = append(internal, ip)
				}
			}
		}
		sp, err := bgp.NewSpeaker(*c, internal, h.log.With("provider", "bgp"))
		if err != nil {
			return err
		}
		if err := sp.Start(ctx); err != nil {
			return err
		}
		h.providers = append(h.providers, &bgpProvider{sp: sp})
	}
	if c := h.cfg.L2; c != nil {
		ifaces := c.Interfaces
		if len(ifaces) == 0 {
			name, err := interfaceOf(h.nodeAddrs(h.node))
			if err != nil {
				return err
			}
			ifaces = []string{name}
		}
		r, err := l2.NewResponder(ifaces, h.log.With("provider", "l2"))
		if err != nil {
			return err
		}
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		h.liveness = newLiveness(h.client, h.cfg.LeaseNamespace, h.node, sec(c.LeaseRenewSeconds), sec(c.LeaseDurationSeconds), h.log, h.poke)
		// Back from an outage or a partition: the others may have taken
		// this node's IPs meanwhile; announcing them again moves clients back.
		h.liveness.resumed = func() { r.Reannounce(r.Owned()) }
		h.providers = append(h.providers, &l2Provider{r: r})
	}
	return nil
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
