package external

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
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
		a.enqueue(svc)
	}
}

// lead campaigns for the allocator Lease until ctx ends; while leader it
// runs the allocator and lets the webhook send. A candidate campaigns only
// while it can do all a leader does (leadBlocker); one that cannot gives
// up a Lease it holds and stands back, so that another replica leads.
func (h *Hook) lead(ctx context.Context) {
	t := h.conf().LeaderLease
	h.fence.renewDeadline = t.RenewDeadline.Duration
	lock := &fencedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metaOf(h.conf().LeaseNamespace, AllocatorLeaseName),
		Client:     h.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: h.identity},
	}, fence: &h.fence}
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
			ReleaseOnCancel: true, Name: AllocatorLeaseName, WatchDog: h.watchdog,
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
func (h *Hook) waitReadyToLead(ctx context.Context, lock resourcelock.Interface, t LeaseTiming) bool {
	released := false
	for {
		err := h.leadBlocker()
		if err == nil {
			return true
		}
		if !errors.Is(err, errNotStarted) && !released {
			released = h.releaseHeld(ctx, lock, t)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(t.RetryPeriod.Duration):
		}
	}
}

// releaseHeld gives up the Lease if it names this candidate, as client-go
// releases it; it reports whether the Lease is not this candidate's now.
func (h *Hook) releaseHeld(ctx context.Context, lock resourcelock.Interface, t LeaseTiming) bool {
	rctx, cancel := context.WithTimeout(ctx, t.RenewDeadline.Duration)
	defer cancel()
	r, _, err := lock.Get(rctx)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		return false
	}
	if r.HolderIdentity != lock.Identity() {
		return true
	}
	now := metav1.NewTime(time.Now())
	err = lock.Update(rctx, resourcelock.LeaderElectionRecord{LeaderTransitions: r.LeaderTransitions,
		LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
	if err != nil {
		h.log.Warn("external: giving up the allocator lease this candidate held", "err", err)
		return false
	}
	h.log.Info("external: gave up the allocator lease this candidate held; it cannot lead now", "node", h.node)
	return true
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
// at the renew deadline (leaseFence) as well as with the elector's, and
// every write of the term goes out with that context (termCtx).
func (h *Hook) leadTerm(ectx context.Context) error {
	ctx, end := h.fence.begin(ectx)
	defer end(nil)
	h.mu.Lock()
	h.term = ctx
	h.mu.Unlock()
	context.AfterFunc(ctx, func() { h.endTerm(ctx) })
	h.log.Info("external: holding allocator lease", "node", h.node)
	if err := h.leadBlocker(); err != nil {
		return cannotLead{err}
	}
	if h.role == roleController && h.conf().settles() {
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
func (h *Hook) newTermAllocator() (*allocator, error) {
	cfg := h.conf()
	if len(cfg.pools) == 0 {
		return nil, nil
	}
	a, err := newAllocator(cfg, h.client, corelisters.NewServiceLister(h.services.GetIndexer()), h.leaderRec, h.log.With("component", "ipam"))
	if err != nil {
		return nil, err
	}
	h.resolve() // the registry knows every address before the first allocation
	a.alloc.Reserved = h.reserved
	if err := a.rebuild(); err != nil {
		return nil, fmt.Errorf("rebuild allocation state: %w", err)
	}
	return a, nil
}

// runAllocator runs a (nil: none) until ctx ends. When the pools change
// (reload) it stops a and runs a new allocator of the pools now in force,
// rebuilt from the Services' status as a new leader's is: a Service keeps
// its address while a pool that serves it holds it.
func (h *Hook) runAllocator(ctx context.Context, a *allocator) {
	for {
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if a != nil {
				a.run(actx)
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
		next.inherit(a)
		h.mu.Lock()
		h.alloc, a = next, next
		h.mu.Unlock()
		h.log.Info("external: allocator restarted with the pools in force", "pools", len(h.conf().pools))
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
func (h *Hook) report(refusals []refusal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := map[string]bool{}
	for _, r := range refusals {
		if _, svc := r.obj.(*corev1.Service); svc && r.reason == ReasonExternalIPNotAllowed {
			// The model tells it (portal's ExternalIPNotAllowed problem),
			// wherever it runs: the controller's problems and each
			// node's. Told here too, it would be told twice.
			continue
		}
		k := string(r.obj.GetUID()) + "/" + r.reason + "/" + r.ip
		now[k] = true
		if h.reported[k] {
			continue
		}
		h.leaderRec.Event(r.obj, corev1.EventTypeWarning, r.reason, r.msg)
	}
	h.reported = now
}
