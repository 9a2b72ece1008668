package external

import (
	"context"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// reload puts the custom resources as they are now in force, without a
// restart. It runs in Run's goroutine, which owns the providers; those it
// stops are started again by Run (startDue) with the new configuration.
//
// What churns, and nothing else:
//   - a pool change: the allocator starts a new term from the Services'
//     status (reloadAllocator), so every Service keeps its address while
//     a pool that serves it still holds it; the registry and the
//     advertisements apply at the next look, and only the addresses whose
//     announcement they change are withdrawn or announced;
//   - a change of this node's BGP peers (one added, deleted, or changed,
//     a password say): the running speaker changes those peers alone
//     (bgp.Speaker.SetPeers), and only their sessions reset;
//   - a change of this node's ASN, router ID or next hops (or a speaker
//     that is not running, or an in-place change that failed): the speaker
//     is stopped and started again, which closes every session of this
//     node and withdraws its routes until they re-establish;
//   - a change of this node's L2 interfaces or lease timing: the
//     responder is stopped and started again (its addresses are announced
//     again with gratuitous ARP and unsolicited NA); its liveness Lease
//     goes on;
//   - a change of the webhook in force (its LoadBalancerWebhook, the key
//     or CA it reads, the pools it picks): the webhook sender alone is
//     stopped and started again, and starts a new term with a snapshot.
//
// The first reload (initial), before any provider runs, only puts the
// configuration in force: the providers and the allocator start with it.
func (h *Hook) reload(ctx context.Context, initial bool) {
	w := h.crd
	cc, mem := convertCRDs(h.base, w.objects(h.log), w.mem)
	w.mem = mem
	if h.role == roleController {
		w.passwords = cc.passwords
	}
	h.moves.crdPeers = cc.peers
	cfg := cc.cfg
	if h.role.node() {
		cfg = cc.forNode(h.ownNode())
	}
	p, err := cfg.parse()
	if err != nil {
		// Each object was parsed alone and with the others: only a bug
		// gets here. The configuration in force stays.
		h.log.Error("external: the custom resources make no configuration; keeping the one in force", "err", err)
		return
	}
	old := h.conf()
	h.cfg.Store(p)
	h.regMu.Lock()
	h.registry.cfg = p
	h.regMu.Unlock()
	h.mu.Lock()
	h.verdicts = cc.verdicts
	h.mu.Unlock()
	for _, v := range cc.verdicts {
		if v.err != nil {
			h.log.Warn("external: custom resource invalid", "kind", v.kind, "name", v.name, "lastGoodInForce", v.stale, "err", v.err)
		}
	}
	if h.role.controller() && !sameWebhook(old, p) {
		h.log.Info("external: webhook configuration", "from", cc.webhookSource(h.base), "initial", initial)
		if !initial {
			h.replan(ctx, "webhook", p.Webhook != nil, h.startWebhook)
		}
	}
	if initial {
		return
	}
	if !reflect.DeepEqual(old.Pools, p.Pools) {
		h.log.Info("external: pools changed", "pools", len(p.Pools))
		select {
		case h.poolsChanged <- struct{}{}:
		default:
		}
	}
	if h.role.node() {
		if !sameBGP(old, p) && !h.bgpPeersInPlace(ctx, old, p) {
			h.log.Info("external: this node's BGP configuration changed; restarting its speaker", "configured", p.BGP != nil)
			h.replan(ctx, "bgp", p.BGP != nil, h.startBGP)
		}
		if !sameL2(old, p) {
			h.log.Info("external: this node's L2 configuration changed; restarting its responder", "configured", p.L2 != nil)
			h.replan(ctx, "l2", p.L2 != nil, h.startL2)
		}
	}
	h.poke()
}

// bgpPeersInPlace applies a change of this node's BGP peers alone to its
// running speaker, so that only the sessions of the peers added, deleted or
// changed reset; it reports false when that does not apply (the speaker
// must start again).
func (h *Hook) bgpPeersInPlace(ctx context.Context, old, p *parsed) bool {
	if old.BGP == nil || p.BGP == nil || old.bgpErr != nil || p.bgpErr != nil {
		return false
	}
	a, b := *old.BGP, *p.BGP
	a.Peers, b.Peers = nil, nil
	if !reflect.DeepEqual(a, b) {
		return false
	}
	i := slices.IndexFunc(h.providers, func(pr Provider) bool { return pr.Name() == "bgp" })
	if i < 0 {
		return false
	}
	bp, ok := h.providers[i].(*bgpProvider)
	if !ok {
		return false
	}
	if err := bp.sp.SetPeers(ctx, p.BGP.Peers); err != nil {
		h.log.Warn("external: BGP peers not changed in place; restarting the speaker", "err", err)
		return false
	}
	h.log.Info("external: this node's BGP peers changed in place", "peers", len(p.BGP.Peers))
	return true
}

func sameBGP(a, b *parsed) bool {
	return reflect.DeepEqual(a.BGP, b.BGP) && errString(a.bgpErr) == errString(b.bgpErr)
}

func sameL2(a, b *parsed) bool {
	return reflect.DeepEqual(a.L2, b.L2) && slices.Equal(a.l2Patterns, b.l2Patterns)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// replan stops provider name if it runs (withdrawing what it announced)
// and, when want, schedules its start now, whatever back-off an earlier
// configuration's failures had built up.
func (h *Hook) replan(ctx context.Context, name string, want bool, start func(context.Context) (Provider, error)) {
	if i := slices.IndexFunc(h.providers, func(p Provider) bool { return p.Name() == name }); i >= 0 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := h.providers[i].Close(cctx); err != nil {
			h.log.Warn("provider close failed", "provider", name, "err", err)
		}
		cancel()
		h.providers = slices.Delete(h.providers, i, i+1)
		h.phealth.metrics.Announced(name, 0)
	}
	h.starts = slices.DeleteFunc(h.starts, func(s providerStart) bool { return s.name == name })
	h.phealth.reset(name)
	if want {
		h.starts = append(h.starts, providerStart{name, start})
		h.phealth.pending(name)
	}
}

// reset forgets provider name's failures and back-off: it is configured
// anew (or no more).
func (p *providerHealth) reset(name string) {
	if p.st[name] == nil {
		return
	}
	if p.health != nil {
		p.health.ProviderFailed(name, nil)
	}
	delete(p.st, name)
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
