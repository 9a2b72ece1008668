package external

import (
	"context"
	"fmt"

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
		LeaseMeta:  metaOf(h.conf().LeaseNamespace, AllocatorLeaseName),
		Client:     h.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: h.identity},
	}
	t := h.conf().LeaderLease
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
	if h.role == roleController && h.conf().settles() {
		h.seedGrants(ctx)
	}
	a, err := h.newTermAllocator()
	if err != nil {
		h.log.Error("external: allocator", "err", err)
		return
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
	if late != nil && late != n {
		h.leadWebhook(ctx, late)
	}
	h.poke()
	h.runAllocator(ctx, a)
}

// newTermAllocator builds the allocator of the pools in force, its state
// rebuilt from the Services' status (nil without pools).
func (h *Hook) newTermAllocator() (*allocator, error) {
	cfg := h.conf()
	if len(cfg.pools) == 0 {
		return nil, nil
	}
	a, err := newAllocator(cfg, h.client, corelisters.NewServiceLister(h.services.GetIndexer()), h.rec, h.log.With("component", "ipam"))
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
		k := string(r.obj.GetUID()) + "/" + r.reason + "/" + r.ip
		now[k] = true
		if h.reported[k] {
			continue
		}
		h.rec.Event(r.obj, corev1.EventTypeWarning, r.reason, r.msg)
	}
	h.reported = now
}
