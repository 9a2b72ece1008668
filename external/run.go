package external

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Run runs until ctx ends; then it withdraws every announcement (providers'
// Close) before returning. What it runs depends on the hook's role: the
// per-node part (providers, the liveness Lease), the campaign for the
// cluster-wide part, or both.
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
		h.leaderBroadcast.StartRecordingToSink(leaderEventSink{events: h.client.CoreV1(), term: h.termCtx})
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
		h.crd.factory.Start(ctx.Done())
		defer h.crd.factory.Shutdown()
		h.crd.secrets.Start(ctx.Done())
		defer h.crd.secrets.Shutdown()
		crdChanged = h.crd.changed
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
		if !h.crd.waitSynced(ctx, h.log) {
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
			stop, err := h.watchLiveness(ctx, &wg)
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
	// after its provider's back-off (retryFirst, doubling up to retryMax;
	// providerHealth), not only when something else changes; providers
	// that took the state are not told it again.
	told := map[Provider]string{}
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
		fp := fingerprint(st)
		var again time.Time // when to try failed updates again
		for _, p := range h.providers {
			if told[p] == fp {
				continue
			}
			err := p.Update(ctx, st)
			h.observeAnnounced(p) // what it announces, also after a partial failure
			if err != nil {
				again = earliest(again, h.phealth.failed(p.Name(), stageUpdate, err, time.Now()))
				continue
			}
			told[p] = fp
			h.phealth.ok(p.Name())
		}
		h.observePools(st.Leader)
		h.noteNextHops(st, st.Leader)
		// The leader's writes go out in its term (termCtx): none once
		// the term is over, not even one already under way.
		tctx := h.termCtx()
		if h.crd != nil && st.Leader && tctx != nil {
			again = earliest(again, h.writeStatus(tctx))
			if h.role == roleController {
				again = earliest(again, h.publishPasswords(tctx))
			}
		}
		if h.role == roleController && h.conf().settles() && tctx != nil {
			if err := h.publishGrants(tctx); err != nil {
				backoff = nextBackoff(backoff)
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
	// Withdraw first: routers must stop sending here before the dataplane goes.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range h.providers {
		if err := p.Close(cctx); err != nil {
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
	followLiveness()
}

// followLiveness tells the providers that follow liveness alone that it
// changed.
func (h *Hook) followLiveness() {
	for _, p := range h.providers {
		if f, ok := p.(followsLiveness); ok {
			f.followLiveness()
			h.observeAnnounced(p)
		}
	}
}

// nextExpiry sets expiry for the earliest moment a node alive now could
// be judged dead (liveness.nextChange).
func (h *Hook) nextExpiry(expiry *time.Timer) {
	if h.liveness == nil {
		return
	}
	if next := h.liveness.nextChange(); !next.IsZero() {
		expiry.Reset(time.Until(next) + time.Millisecond)
	} else {
		expiry.Stop()
	}
}

// The back-off of a provider's failed start or update: retryFirst,
// doubling up to retryMax.
const (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

func nextBackoff(d time.Duration) time.Duration {
	if d <= 0 {
		return retryFirst
	}
	return min(2*d, retryMax)
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
	return len(c.pools) > 0 || c.Webhook != nil || c.PodExternalIPs || c.CRDs || c.settles()
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
		return c.BGP == nil && c.L2 == nil && !c.PodExternalIPs && !c.CRDs && !c.settles()
	case roleController:
		return !h.needsLeader()
	}
	return false
}

// fingerprint: providers are called again only when something they can see
// changed (including liveness and what this node serves). It grows with
// the targets and with the nodes, not with their product: the nodes of the
// Cluster policy are written once, each node's liveness once, and the L2
// advertisements as which of them pick each address and each node.
func fingerprint(s *State) string {
	b := fmt.Appendf(nil, "%v|%v|", s.Leader, s.cluster)
	for _, t := range s.Targets {
		var nodes any = t.Nodes
		if len(t.Nodes) > 0 && sameNodes(t.Nodes, s.cluster) {
			nodes = "cluster"
		}
		b = fmt.Appendf(b, "%s %s %v %v %d %v;", t.IP, t.Service, t.Local, nodes, t.HealthCheckNodePort, t.Ports)
	}
	for _, ip := range s.IPs() {
		b = fmt.Appendf(b, "%s:%v:%v:%s;", ip, s.Serves(ip), s.ann.bgpRoutes(ip, s.Node), s.ann.l2PicksIP(ip))
	}
	for _, n := range slices.Sorted(maps.Keys(s.NodeAddresses)) {
		b = fmt.Appendf(b, "%s=%v%s,", n, s.Alive(n), s.ann.l2PicksNode(n))
	}
	b = fmt.Appendf(b, "%v", s.NodeAddresses)
	return string(b)
}
