package external

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/providers"
	"github.com/onehop/onehop/external/webhook"
)

func (h *Hook) allocEnqueue(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	svc, ok := o.(*corev1.Service)
	if !ok {
		return
	}
	h.mu.Lock()
	a := h.alloc
	h.mu.Unlock()
	if a != nil {
		a.Enqueue(svc)
	}
}

// lead campaigns for the allocator Lease until ctx ends; while leader it
// runs the allocator and lets the webhook send. A candidate campaigns only
// while it can do all a leader does (leadBlocker); one that cannot gives
// up a Lease it holds and stands back, so that another replica leads.
func (h *Hook) lead(ctx context.Context) {
	t := h.conf().LeaderLease
	h.fence = leases.NewFence(t.RenewDeadline.Duration)
	lock := leases.NewFencedLock(&resourcelock.LeaseLock{
		LeaseMeta:  metaOf(h.conf().LeaseNamespace, leases.AllocatorLeaseName),
		Client:     h.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: h.identity},
	}, h.fence)
	for ctx.Err() == nil {
		if !h.waitReadyToLead(ctx, lock, t) {
			return
		}
		ectx, stop := context.WithCancelCause(ctx)
		h.mu.Lock()
		h.stopCampaign = stop
		h.mu.Unlock()
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: t.Duration.Duration, RenewDeadline: t.RenewDeadline.Duration, RetryPeriod: t.RetryPeriod.Duration,
			ReleaseOnCancel: true, Name: leases.AllocatorLeaseName, WatchDog: h.watchdog,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: h.leading,
				OnStoppedLeading: func() {
					h.log.Info("external: lost allocator lease", "node", h.node)
					h.poke()
				},
			},
		})
		if err != nil {
			stop(nil)
			h.log.Error("external: leader election", "err", err)
			return
		}
		le.Run(ectx)
		var cl cannotLead
		if errors.As(context.Cause(ectx), &cl) && ctx.Err() == nil {
			// Given up (released): another replica takes the Lease
			// meanwhile, and this one says why it is unhealthy.
			h.log.Warn("external: standing back from the allocator lease", "for", t.Duration.Duration, "err", cl.err)
			select {
			case <-ctx.Done():
			case <-time.After(t.Duration.Duration):
			}
		}
		stop(nil)
		h.mu.Lock()
		h.stopCampaign, h.leadErr = nil, nil
		h.mu.Unlock()
	}
}

// cannotLead is why a leader gave its Lease up: a duty of the leader that
// this process cannot do.
type cannotLead struct{ err error }

func (c cannotLead) Error() string { return "cannot lead: " + c.err.Error() }

// errNotStarted: the webhook sender's first start has not been tried yet.
var errNotStarted = errors.New("the webhook sender has not started yet")

// leadBlocker is why this process cannot lead now (nil: it can): the
// webhook is configured but its sender did not start (errNotStarted
// before its first try).
func (h *Hook) leadBlocker() error {
	if h.conf().Webhook == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.notifier != nil:
		return nil
	case h.webhookErr != nil:
		return fmt.Errorf("webhook sender not started: %w", h.webhookErr)
	}
	return errNotStarted
}

// waitReadyToLead waits until nothing blocks this process from leading
// (false when ctx ended first). Meanwhile a Lease it still holds (from
// before a restart: the same identity) is given up at once, so that
// another replica need not wait for it to expire.
func (h *Hook) waitReadyToLead(ctx context.Context, lock resourcelock.Interface, t config.LeaseTiming) bool {
	released := false
	for {
		err := h.leadBlocker()
		if err == nil {
			return true
		}
		if !errors.Is(err, errNotStarted) && !released {
			released = leases.ReleaseHeld(ctx, lock, t.RenewDeadline.Duration, h.log, h.node)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(t.RetryPeriod.Duration):
		}
	}
}

// leading runs one leadership term (the elector's OnStartedLeading). A
// term that ends while the elector still leads (the renew deadline
// passed, or a leader's duty cannot run) ends the elector's as well: the
// Lease is released.
func (h *Hook) leading(ctx context.Context) {
	err := h.leadTerm(ctx)
	if ctx.Err() == nil {
		h.endCampaign(err)
	}
}

// endCampaign ends this candidate's campaign (the elector releases a
// Lease it holds); cause says why.
func (h *Hook) endCampaign(cause error) {
	var cl cannotLead
	if errors.As(cause, &cl) {
		h.log.Error("external: cannot lead; giving the allocator lease up", "err", cl.err)
	} else {
		h.log.Warn("external: leadership term over; giving the allocator lease up", "err", cause)
	}
	h.mu.Lock()
	stop := h.stopCampaign
	if cl.err != nil {
		h.leadErr = cause
	}
	h.mu.Unlock()
	if stop != nil {
		stop(cause)
	}
}

// leadTerm runs a term until it ends and returns why: its context ends
// at the renew deadline (leases.Fence) as well as with the elector's, and
// every write of the term goes out with that context (termCtx).
func (h *Hook) leadTerm(ectx context.Context) error {
	ctx, end := h.fence.Begin(ectx)
	defer end(nil)
	h.mu.Lock()
	h.term = ctx
	h.mu.Unlock()
	context.AfterFunc(ctx, func() { h.endTerm(ctx) })
	h.log.Info("external: holding allocator lease", "node", h.node)
	if err := h.leadBlocker(); err != nil {
		return cannotLead{err}
	}
	if h.role == roleController && h.conf().Settles() {
		h.seedGrants(ctx)
	}
	a, err := h.newTermAllocator()
	if err != nil {
		return cannotLead{fmt.Errorf("allocator: %w", err)}
	}
	h.mu.Lock()
	n := h.notifier
	h.mu.Unlock()
	if n != nil {
		if err := h.leadWebhook(ctx, n); err != nil {
			return cannotLead{err}
		}
	}
	h.mu.Lock()
	if h.term != ctx || ctx.Err() != nil {
		h.mu.Unlock()
		return context.Cause(ctx)
	}
	h.leader, h.alloc, h.leadCtx = true, a, ctx
	// A webhook sender that started meanwhile (its start had failed,
	// startWebhook) leads from now.
	late := h.notifier
	h.mu.Unlock()
	if late != nil && late != n {
		if err := h.leadWebhook(ctx, late); err != nil {
			return cannotLead{err}
		}
	}
	h.poke()
	h.runAllocator(ctx, a)
	return context.Cause(ctx)
}

// endTerm ends the leadership term ctx: from now on this process writes
// nothing as leader.
func (h *Hook) endTerm(ctx context.Context) {
	h.mu.Lock()
	if h.term != ctx {
		h.mu.Unlock()
		return
	}
	n := h.notifier
	h.term, h.leader, h.alloc, h.reported, h.leadCtx = nil, false, nil, nil, nil
	h.mu.Unlock()
	if n != nil {
		n.Demote()
	}
	h.setGranted(nil)
	h.log.Info("external: leadership term over", "node", h.node, "why", context.Cause(ctx))
	h.poke()
}

// termCtx is the running leadership term's context, nil between terms:
// every write the leader makes goes out with it, so none is sent once
// the term is over and one in flight is cancelled.
func (h *Hook) termCtx() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.term == nil || h.term.Err() != nil {
		return nil
	}
	return h.term
}

// checkLeading gives up the Lease when the leader can no longer do a
// leader's duty (its webhook sender failed to start again).
func (h *Hook) checkLeading() {
	err := h.leadBlocker()
	if err == nil || errors.Is(err, errNotStarted) {
		return
	}
	h.mu.Lock()
	leader := h.leader
	h.mu.Unlock()
	if leader {
		h.endCampaign(cannotLead{err})
	}
}

// newTermAllocator builds the allocator of the pools in force, its state
// rebuilt from the Services' status (nil without pools).
func (h *Hook) newTermAllocator() (*alloc.Allocator, error) {
	cfg := h.conf()
	if len(cfg.IPAMPools) == 0 {
		return nil, nil
	}
	a, err := alloc.New(cfg, h.client, corelisters.NewServiceLister(h.services.GetIndexer()), h.leaderRec, h.log.With("component", "ipam"))
	if err != nil {
		return nil, err
	}
	h.resolve() // the registry knows every address before the first allocation
	a.SetReserved(h.reserved)
	if err := a.Rebuild(); err != nil {
		return nil, fmt.Errorf("rebuild allocation state: %w", err)
	}
	return a, nil
}

// runAllocator runs a (nil: none) until ctx ends. When the pools change
// (reload) it stops a and runs a new allocator of the pools now in force,
// rebuilt from the Services' status as a new leader's is: a Service keeps
// its address while a pool that serves it holds it.
func (h *Hook) runAllocator(ctx context.Context, a *alloc.Allocator) {
	for {
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if a != nil {
				a.Run(actx)
			} else {
				<-actx.Done()
			}
		}()
		select {
		case <-ctx.Done():
		case <-h.poolsChanged:
		}
		cancel()
		<-done
		if ctx.Err() != nil {
			return
		}
		next, err := h.newTermAllocator()
		if err != nil {
			h.log.Error("external: allocator of the new pools; allocating nothing until they change again", "err", err)
		}
		next.Inherit(a)
		h.mu.Lock()
		h.alloc, a = next, next
		h.mu.Unlock()
		h.log.Info("external: allocator restarted with the pools in force", "pools", len(h.conf().IPAMPools))
		h.poke()
	}
}

func metaOf(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

// report puts an event on each claimant the registry refuses, once per
// refusal and leadership term (a refusal that goes away and comes back is
// reported again). Only the leader reports, so that each refusal is told
// once, not once per node.
func (h *Hook) report(refusals []claims.Refusal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := map[string]bool{}
	for _, r := range refusals {
		if _, svc := r.Obj.(*corev1.Service); svc && r.Reason == claims.ReasonExternalIPNotAllowed {
			// The model tells it (portal's ExternalIPNotAllowed problem),
			// wherever it runs: the controller's problems and each
			// node's. Told here too, it would be told twice.
			continue
		}
		k := string(r.Obj.GetUID()) + "/" + r.Reason + "/" + r.IP
		now[k] = true
		if h.reported[k] {
			continue
		}
		h.leaderRec.Event(r.Obj, corev1.EventTypeWarning, r.Reason, r.Msg)
	}
	h.reported = now
}

// leadWebhook claims a term and starts the webhook sender's part of it;
// an error when it could not (ctx ended, the Lease moved on, the term is
// not above the sender's last): the caller gives up the Lease, so that a
// replica that can send leads.
func (h *Hook) leadWebhook(ctx context.Context, n *webhook.Notifier) error {
	term, err := leases.ClaimWebhookTerm(ctx, h.client.CoordinationV1().Leases(h.conf().LeaseNamespace), leases.AllocatorLeaseName, h.identity, h.log)
	if err == nil {
		err = n.Lead(ctx, term)
	}
	if err != nil {
		return fmt.Errorf("webhook sender not started in this term: %w", err)
	}
	h.log.Info("external: webhook term", "term", term)
	return nil
}

// startWebhook starts the webhook sender of the cluster-wide part.
func (h *Hook) startWebhook(ctx context.Context) (providers.Provider, error) {
	n, err := webhook.New(*h.conf().Webhook, h.log.With("provider", "webhook"), h.webhookFailed, h.webhookDelivered)
	h.mu.Lock()
	h.webhookErr = err // a process without its sender does not lead (leadBlocker)
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	n.Start(ctx)
	for _, o := range []string{dataplane.WebhookSuccess, dataplane.WebhookRejected, dataplane.WebhookUnreachable} {
		h.metrics.WebhookRequests(o, 0) // the series exist from the start
	}
	p := providers.NewWebhook(n, func(ip netip.Addr) bool { return h.conf().WebhookPicks(ip) }, func() {
		h.mu.Lock()
		if h.notifier == n {
			h.notifier = nil
		}
		h.mu.Unlock()
	})
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
			p.Resend()
		}()
	}
	return p, nil
}

// webhookDelivered counts a request the receiver took.
func (h *Hook) webhookDelivered(string) {
	h.metrics.WebhookRequests(dataplane.WebhookSuccess, 1)
}

// webhookFailed counts a failed request and puts an event on the Service
// (first and every 5th attempt).
func (h *Hook) webhookFailed(service string, err error, attempt int) {
	h.metrics.WebhookRequests(providers.WebhookOutcome(err), 1)
	if attempt != 1 && attempt%5 != 0 {
		return
	}
	obj, ok, _ := h.services.GetStore().GetByKey(service) // "namespace/name", as the store keys
	if !ok {
		return
	}
	h.leaderRec.Eventf(obj.(*corev1.Service), corev1.EventTypeWarning, "WebhookFailed", "attempt %d: %v", attempt, err)
}

// seedGrants starts a new leader's registry from the grants its
// predecessor recorded, so that a Pod holding an address keeps it across
// a change of controller (on a fresh start the oldest claimant would win).
func (h *Hook) seedGrants(ctx context.Context) {
	cm, err := h.client.CoreV1().ConfigMaps(h.conf().LeaseNamespace).Get(ctx, claims.GrantsConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		h.log.Warn("external: reading the pod external IP grants; the oldest claimant wins ties this once", "err", err)
		return
	}
	gs, err := claims.DecodeGrants(cm)
	if err != nil {
		h.log.Warn("external: pod external IP grants unreadable; writing them afresh", "err", err)
		return
	}
	h.regMu.Lock()
	h.registry.Seed(gs)
	h.granted = cm
	h.regMu.Unlock()
}

// publishGrants writes the registry's latest pod external IP holders to
// the grants ConfigMap when they changed (the leading controller of a
// split install). An error is tried again by the caller.
func (h *Hook) publishGrants(ctx context.Context) error {
	h.mu.Lock()
	leader := h.leader
	h.mu.Unlock()
	if !leader {
		return nil
	}
	var pods []*corev1.Pod
	if h.pods != nil {
		for _, o := range h.pods.GetStore().List() {
			pods = append(pods, o.(*corev1.Pod))
		}
	}
	h.regMu.Lock()
	own, prev := h.own, h.granted
	h.regMu.Unlock()
	if own == nil {
		return nil
	}
	ns := h.conf().LeaseNamespace
	return claims.Publish(ctx, h.client.CoreV1().ConfigMaps(ns), ns, own, pods, prev, h.setGranted)
}

func (h *Hook) setGranted(cm *corev1.ConfigMap) {
	h.regMu.Lock()
	h.granted = cm
	h.regMu.Unlock()
}

// writeStatus brings every custom resource's status to what its last
// verdict and the allocations say (config.Watch.WriteStatus); it returns
// when to try again after a failed write (zero when none failed).
func (h *Hook) writeStatus(ctx context.Context) time.Time {
	h.mu.Lock()
	verdicts := h.verdicts
	h.mu.Unlock()
	return h.crd.WriteStatus(ctx, verdicts, h.poolCounts())
}

// poolCounts are each pool's used and free addresses: used are those
// Services hold (the registry's last answer), free the rest, capped at
// the largest int64.
func (h *Hook) poolCounts() map[string][2]int64 {
	h.regMu.Lock()
	held := map[netip.Addr]bool{}
	if h.own != nil {
		for _, ips := range h.own.LB {
			for _, ip := range ips {
				held[ip] = true
			}
		}
	}
	h.regMu.Unlock()
	return h.conf().PoolCounts(held)
}

// observePools sets the allocator's gauges: each pool's addresses while
// this process holds the allocator Lease (leader), none otherwise.
func (h *Hook) observePools(leader bool) {
	if h.metrics == nil {
		return
	}
	if !leader {
		h.metrics.Pools(nil)
		return
	}
	h.metrics.Pools(poolAddresses(h.poolCounts()))
}

// poolAddresses turns poolCounts' used and free addresses into the
// gauges' in use and total, the total capped at the largest int64.
func poolAddresses(counts map[string][2]int64) map[string]dataplane.PoolAddresses {
	out := make(map[string]dataplane.PoolAddresses, len(counts))
	for name, c := range counts {
		total := c[0] + c[1]
		if c[1] > math.MaxInt64-c[0] {
			total = math.MaxInt64
		}
		out[name] = dataplane.PoolAddresses{InUse: c[0], Total: total}
	}
	return out
}
