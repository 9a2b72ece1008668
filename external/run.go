package external

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/providers"
)

// Run runs until ctx ends; then it withdraws every announcement (providers'
// Close) before returning, but what a provider leaves to its routers for
// the agent's restart (providers.Restartable: BGP graceful restart). What
// it runs depends on the hook's role: the per-node part (providers, the
// liveness Lease), the campaign for the cluster-wide part, or both.
func (h *Hook) Run(ctx context.Context) error {
	if h.idle() {
		h.log.Info("external: nothing to do in this role", "role", h.role)
		<-ctx.Done()
		return nil
	}
	if h.broadcast != nil {
		h.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: h.client.CoreV1().Events("")})
		defer h.broadcast.Shutdown()
	}
	if h.leaderBroadcast != nil {
		h.leaderBroadcast.StartRecordingToSink(leases.NewEventSink(h.client.CoreV1(), h.termCtx))
		defer h.leaderBroadcast.Shutdown()
	}
	for _, inf := range []cache.SharedIndexInformer{h.services, h.slices, h.nodes, h.pods, h.grants} {
		if inf != nil {
			if _, err := inf.AddEventHandler(h.handler()); err != nil {
				return err
			}
		}
	}
	if h.role.controller() {
		if _, err := h.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { h.allocEnqueue(o) },
			UpdateFunc: func(_, o any) { h.allocEnqueue(o) },
			DeleteFunc: func(o any) { h.allocEnqueue(o) },
		}); err != nil {
			return err
		}
	}
	for _, f := range []informers.SharedInformerFactory{h.factory, h.podFactory, h.grantFactory} {
		if f == nil {
			continue
		}
		f.Start(ctx.Done())
		defer f.Shutdown()
	}
	var crdChanged <-chan struct{}
	if h.crd != nil {
		h.crd.Start(ctx.Done())
		defer h.crd.Shutdown()
		crdChanged = h.crd.Changed()
	}
	if h.watch != nil {
		h.watch.Start(ctx)
		if !cache.WaitForCacheSync(ctx.Done(), h.services.HasSynced, h.slices.HasSynced) {
			return fmt.Errorf("external: the shared caches of Services and EndpointSlices did not sync: %w", ctx.Err())
		}
	}
	for _, f := range []informers.SharedInformerFactory{h.factory, h.podFactory, h.grantFactory} {
		if f == nil {
			continue
		}
		for t, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("external: cache of %v did not sync", t)
			}
		}
	}
	if h.crd != nil {
		if !h.crd.WaitSynced(ctx) {
			return fmt.Errorf("external: the caches of the onehop.io custom resources did not sync: %w", ctx.Err())
		}
		// Before anything runs: the providers start with it.
		h.reload(ctx, true)
	}
	// One look over the complete listings, even if nothing changes after
	// them: the registry's first answer (RefusedExternalIPs) comes from it.
	h.poke()
	h.planProviders()
	var wg sync.WaitGroup
	if h.role.controller() && h.needsLeader() {
		wg.Go(func() { h.lead(ctx) })
	}
	// A provider that cannot start (a missing interface or secret, a
	// listen error) is tried again after its back-off (startRetry), and
	// what comes with it starts with it: the liveness Lease with L2, the
	// webhook's sender.
	startRetry := time.NewTimer(time.Hour)
	defer startRetry.Stop()
	startRetry.Stop()
	var stopLiveness func()
	defer func() {
		if stopLiveness != nil {
			stopLiveness()
		}
	}()
	notifying := false
	startAll := func() error {
		if len(h.starts) == 0 {
			return nil
		}
		if next := h.startDue(ctx, time.Now()); !next.IsZero() {
			startRetry.Reset(time.Until(next))
		}
		if h.liveness != nil && stopLiveness == nil {
			stop, err := h.startLiveness(ctx, &wg)
			if err != nil {
				return err
			}
			stopLiveness = stop
		}
		if h.notifier != nil && !notifying {
			h.notifier.Start(ctx)
			notifying = true
		}
		return nil
	}
	if err := startAll(); err != nil {
		return err
	}
	// Every change the hook acts on comes with a poke (informer events,
	// what the dataplane serves, leadership; livePoke for a node's first
	// or last Lease, a dead node's Lease renewed again, a node heard)
	// except one: a node whose Lease renewals stop. For that the hook
	// sleeps until the earliest moment one could expire (nextChange), not
	// on a fixed tick, so an idle node computes nothing.
	// A burst of changes (endpoint churn, every sync of the dataplane) is
	// looked at once per minInterval: at 10k Services one look costs tens
	// of milliseconds.
	const minInterval = 200 * time.Millisecond
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	expiry.Stop()
	throttle := time.NewTimer(time.Hour)
	defer throttle.Stop()
	throttle.Stop()
	// told is what each provider was last told without an
	// error. A failed update is tried again with the state of that moment
	// after its provider's back-off (providers.NextBackoff, followed by
	// providers.Health), not only when something else changes; providers
	// that took the state are not told it again.
	told := map[providers.Provider]string{}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	retry.Stop()
	var backoff time.Duration
	var looked time.Time
	pending, livePending := false, false
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
			continue
		case <-h.wake:
			pending = true
		case <-h.liveWake:
			livePending = true
		case <-expiry.C:
			livePending = true
		case <-retry.C:
			pending = true
		case <-startRetry.C:
			pending = true
		case <-crdChanged:
			h.reload(ctx, false)
			for p := range told { // those it stopped
				if !slices.Contains(h.providers, p) {
					delete(told, p)
				}
			}
			pending = true
		case <-throttle.C:
		}
		// A change of liveness alone (a Lease expired, came back, a node
		// was heard) is looked at at once, and by the providers that
		// follow it alone (followsLiveness): the rest of the state did
		// not change. Providers of the caller's are told a whole state.
		if livePending && len(h.extra) == 0 {
			livePending = false
			h.syncHeartbeatPeers()
			h.nextExpiry(expiry)
			h.followLiveness()
		}
		if livePending {
			pending, livePending = true, false
		}
		if !pending {
			continue
		}
		if wait := minInterval - time.Since(looked); wait > 0 {
			throttle.Reset(wait)
			continue
		}
		pending, looked = false, time.Now()
		h.syncHeartbeatPeers()
		h.nextExpiry(expiry)
		if err := startAll(); err != nil {
			return err
		}
		if h.role.controller() {
			h.checkLeading()
		}
		if h.standby() {
			h.observePools(false)
			h.noteNextHops(nil, false)
			continue
		}
		st := h.state()
		fp := providers.Fingerprint(st)
		var again time.Time // when to try failed updates again
		for _, p := range h.providers {
			if told[p] == fp {
				continue
			}
			err := p.Update(ctx, st)
			h.observeAnnounced(p) // what it announces, also after a partial failure
			if err != nil {
				again = earliest(again, h.phealth.Failed(p.Name(), providers.StageUpdate, err, time.Now()))
				continue
			}
			told[p] = fp
			h.phealth.OK(p.Name())
		}
		h.observePools(st.Leader)
		h.noteNextHops(st, st.Leader)
		// The leader's writes go out in its term (termCtx): none once
		// the term is over, not even one already under way.
		tctx := h.termCtx()
		if h.crd != nil && st.Leader && tctx != nil {
			again = earliest(again, h.writeStatus(tctx))
			if h.role == roleController {
				again = earliest(again, h.crd.PublishPasswords(tctx))
			}
		}
		if h.role == roleController && h.conf().Settles() && tctx != nil {
			if err := h.publishGrants(tctx); err != nil {
				backoff = providers.NextBackoff(backoff)
				again = earliest(again, time.Now().Add(backoff))
				h.log.Warn("pod external IP grants not written; trying again", "err", err, "in", backoff)
			} else {
				backoff = 0
			}
		}
		if !again.IsZero() {
			retry.Reset(time.Until(again))
		}
	}
	// Withdraw first: routers must stop sending here before the dataplane
	// goes. A provider that can leave its announcements to its routers
	// while the agent restarts (BGP graceful restart) does so: the
	// dataplane stays.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range h.providers {
		closeFn := p.Close
		if r, ok := p.(providers.Restartable); ok {
			closeFn = r.CloseForRestart
		}
		if err := closeFn(cctx); err != nil {
			h.log.Warn("provider close failed", "provider", p.Name(), "err", err)
		}
	}
	wg.Wait()
	if h.notifier != nil {
		h.notifier.Wait()
	}
	return nil
}

// followsLiveness is a provider that can be told of a change of the
// nodes' liveness alone, without a new state (the L2 provider).
type followsLiveness interface {
	FollowLiveness()
}

// followLiveness tells the providers that follow liveness alone that it
// changed.
func (h *Hook) followLiveness() {
	for _, p := range h.providers {
		if f, ok := p.(followsLiveness); ok {
			f.FollowLiveness()
			h.observeAnnounced(p)
		}
	}
}

// nextExpiry sets expiry for the earliest moment a node alive now could
// be judged dead (leases.Liveness.NextChange).
func (h *Hook) nextExpiry(expiry *time.Timer) {
	if h.liveness == nil {
		return
	}
	if next := h.liveness.NextChange(); !next.IsZero() {
		expiry.Reset(time.Until(next) + time.Millisecond)
	} else {
		expiry.Stop()
	}
}

// standby: a controller that is not the leader has nothing to tell its
// providers (the webhook sends only from the leader); it computes nothing
// until it leads (leading pokes).
func (h *Hook) standby() bool {
	if h.role != roleController || len(h.extra) > 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.leader
}

// needsLeader: something of the cluster-wide part is configured.
func (h *Hook) needsLeader() bool {
	c := h.conf()
	return len(c.IPAMPools) > 0 || c.Webhook != nil || c.PodExternalIPs || c.CRDs || c.Settles()
}

// idle: nothing is configured for this role, so Run watches nothing. In a
// split install the node agents and the controller read one configuration,
// and each may find nothing in it for itself.
func (h *Hook) idle() bool {
	if len(h.extra) > 0 {
		return false
	}
	switch h.role {
	case roleNode:
		c := h.conf()
		// With the controller settling external IPs, the registry refuses
		// this node's dataplane the claims it gives to someone else.
		return c.BGP == nil && c.L2 == nil && !c.PodExternalIPs && !c.CRDs && !c.Settles()
	case roleController:
		return !h.needsLeader()
	}
	return false
}

// providerStart starts one provider of this process's role; a start that
// fails is tried again with back-off (startDue) until it succeeds.
type providerStart struct {
	name  string
	start func(ctx context.Context) (providers.Provider, error)
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
		h.phealth.Pending(s.name)
	}
	for _, p := range h.extra {
		h.phealth.OK(p.Name())
	}
	h.providers = append(h.providers, h.extra...)
}

// startDue tries the starts that are due at now; a provider that starts
// joins h.providers. It returns when the earliest of those still failing
// is due again (zero when none is left).
func (h *Hook) startDue(ctx context.Context, now time.Time) (next time.Time) {
	left := h.starts[:0]
	for _, s := range h.starts {
		if !h.phealth.Due(s.name, now) {
			next = earliest(next, h.phealth.Next(s.name))
			left = append(left, s)
			continue
		}
		p, err := s.start(ctx)
		if err != nil {
			next = earliest(next, h.phealth.Failed(s.name, providers.StageStart, err, now))
			left = append(left, s)
			continue
		}
		h.phealth.OK(s.name)
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
	cc := h.crd.Convert(h.base)
	h.moves.crdPeers = cc.Peers
	cfg := cc.Config
	if h.role.node() {
		cfg = cc.ForNode(h.ownNode())
	}
	p, err := cfg.Parse()
	if err != nil {
		// Each object was parsed alone and with the others: only a bug
		// gets here. The configuration in force stays.
		h.log.Error("external: the custom resources make no configuration; keeping the one in force", "err", err)
		return
	}
	old := h.conf()
	h.cfg.Store(p)
	h.regMu.Lock()
	h.registry.SetConfig(p)
	h.regMu.Unlock()
	h.mu.Lock()
	h.verdicts = cc.Verdicts
	h.mu.Unlock()
	for _, v := range cc.Verdicts {
		if v.Err != nil {
			h.log.Warn("external: custom resource invalid", "kind", v.Kind, "name", v.Name, "lastGoodInForce", v.Stale, "err", v.Err)
		}
	}
	if h.role.controller() && !config.SameWebhook(old, p) {
		h.log.Info("external: webhook configuration", "from", cc.WebhookSource(h.base), "initial", initial)
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
		if !config.SameBGP(old, p) && !h.bgpPeersInPlace(ctx, old, p) {
			h.log.Info("external: this node's BGP configuration changed; restarting its speaker", "configured", p.BGP != nil)
			h.replan(ctx, "bgp", p.BGP != nil, h.startBGP)
		}
		if !config.SameL2(old, p) {
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
func (h *Hook) bgpPeersInPlace(ctx context.Context, old, p *config.Parsed) bool {
	if old.BGP == nil || p.BGP == nil || old.BGPError() != nil || p.BGPError() != nil {
		return false
	}
	a, b := *old.BGP, *p.BGP
	a.Peers, b.Peers = nil, nil
	if !reflect.DeepEqual(a, b) {
		return false
	}
	i := slices.IndexFunc(h.providers, func(pr providers.Provider) bool { return pr.Name() == "bgp" })
	if i < 0 {
		return false
	}
	bp, ok := h.providers[i].(*providers.BGP)
	if !ok {
		return false
	}
	if err := bp.SetPeers(ctx, p.BGP.Peers); err != nil {
		h.log.Warn("external: BGP peers not changed in place; restarting the speaker", "err", err)
		return false
	}
	h.log.Info("external: this node's BGP peers changed in place", "peers", len(p.BGP.Peers))
	return true
}

// replan stops provider name if it runs (withdrawing what it announced)
// and, when want, schedules its start now, whatever back-off an earlier
// configuration's failures had built up.
func (h *Hook) replan(ctx context.Context, name string, want bool, start func(context.Context) (providers.Provider, error)) {
	if i := slices.IndexFunc(h.providers, func(p providers.Provider) bool { return p.Name() == name }); i >= 0 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := h.providers[i].Close(cctx); err != nil {
			h.log.Warn("provider close failed", "provider", name, "err", err)
		}
		cancel()
		h.providers = slices.Delete(h.providers, i, i+1)
		h.metrics.Announced(name, 0)
	}
	h.starts = slices.DeleteFunc(h.starts, func(s providerStart) bool { return s.name == name })
	h.phealth.Reset(name)
	if want {
		h.starts = append(h.starts, providerStart{name, start})
		h.phealth.Pending(name)
	}
}
