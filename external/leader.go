package external

import (
	"context"

	corev1 "k8s.io/api/core/v1"
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
// runs the allocator and lets the webhook send.
func (h *Hook) lead(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaOf(h.cfg.LeaseNamespace, AllocatorLeaseName),
		Client:     h.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: h.identity},
	}
	t := h.cfg.LeaderLease
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: t.Duration.Duration, RenewDeadline: t.RenewDeadline.Duration, RetryPeriod: t.RetryPeriod.Duration,
			ReleaseOnCancel: true, Name: AllocatorLeaseName, WatchDog: h.watchdog,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: h.leading,
				OnStoppedLeading: func() {
					h.mu.Lock()
					n := h.notifier
					h.leader, h.alloc, h.reported, h.leadCtx = false, nil, nil, nil
					h.mu.Unlock()
					if n != nil {
						n.Demote()
					}
					h.setGranted(nil)
					h.log.Info("external: lost allocator lease", "node", h.node)
					h.poke()
				},
			},
		})
		if err != nil {
			h.log.Error("external: leader election", "err", err)
			return
		}
		le.Run(ctx)
	}
}

func (h *Hook) leading(ctx context.Context) {
	h.log.Info("external: holding allocator lease", "node", h.node)
	if h.role == roleController && h.cfg.settles() {
		h.seedGrants(ctx)
	}
	var a *allocator
	if len(h.cfg.pools) > 0 {
		var err error
		a, err = newAllocator(h.cfg, h.client, corelisters.NewServiceLister(h.services.GetIndexer()), h.rec, h.log.With("component", "ipam"))
		if err == nil {
			h.resolve() // the registry knows every address before the first allocation
			a.alloc.Reserved = h.reserved
		}
		if err != nil {
			h.log.Error("external: allocator", "err", err)
			return
		}
		if err := a.rebuild(); err != nil {
			h.log.Error("external: rebuild allocation state", "err", err)
			return
		}
	}
	h.mu.Lock()
	n := h.notifier
	h.mu.Unlock()
	if n != nil && !h.leadWebhook(ctx, n) {
		return
	}
	h.mu.Lock()
	h.leader, h.alloc, h.leadCtx = true, a, ctx
	// A webhook sender that started meanwhile (its start had failed,
	// startWebhook) leads from now.
	late := h.notifier
	h.mu.Unlock()
	if n == nil && late != nil {
		h.leadWebhook(ctx, late)
	}
	h.poke()
	if a != nil {
		a.run(ctx)
	} else {
		<-ctx.Done()
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
		k := string(r.obj.GetUID()) + "/" + r.reason + "/" + r.ip
		now[k] = true
		if h.reported[k] {
			continue
		}
		h.rec.Event(r.obj, corev1.EventTypeWarning, r.reason, r.msg)
	}
	h.reported = now
}
